"""The Kubernetes target: one Kubeflow PyTorchJob (kubeflow.org/v1) per run, created with the
official kubernetes client.

``options.py`` (the spec's ``k8s:`` section), ``render.py`` (manifests as plain dicts, pure),
``crd.py`` (the PyTorchJob CRD the plan is checked against: the cluster's, a file or the cache),
``schema.py`` (the structural and strict checks), ``check.py`` (their problems, and the API
server's, at the spec's file:line:field), ``target.py`` (plan, submit, status, logs, cancel),
``client.py`` (the kubernetes client, imported only to talk to a cluster) and ``logs.py``.
Nothing is imported here, so the package costs nothing."""
