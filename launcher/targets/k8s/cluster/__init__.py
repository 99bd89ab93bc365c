"""The Kubernetes target's talk with the cluster: the client (``client``), pods (``pods``), their
logs (``logs``) and the first pod's ``watch.json`` through the pod proxy (``watch``). Nothing is
imported here."""
