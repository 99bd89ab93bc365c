"""The Kubernetes target's talk with the cluster: the client (``client``), pods (``pods``), their
logs (``logs``), the first pod's ``watch.json`` through the pod proxy (``watch``) and every pod's
ranks' stacks through it (``stacks``). Nothing is imported here."""
