"""The Kubernetes target: one Kubeflow PyTorchJob (kubeflow.org/v1) per run, or with ``k8s.api:
trainjob`` one Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1), created with the
official kubernetes client.

``options.py`` (the spec's ``k8s:`` section), ``apis.py`` (the two APIs as data: group, version,
CRD, container, pod selector), ``payload.py`` (the payload, the handle and the plan's text),
``render.py`` (the one render loop and the parts both APIs share: plain dicts, pure), two small
flavours of it, ``pytorchjob.py`` and ``trainjob.py`` (each API's object, what it refuses in a
spec, its paths back to the spec, its status), ``flavours.py`` (each flavour with its checks, by
``k8s.api``), ``crd.py`` (the CRD the plan is checked against: the cluster's, a file or the
cache), ``schema.py`` and ``trainjob_rules.py`` (the structural and strict checks), ``check.py``
(their problems, and the API server's, at the spec's file:line:field), ``target.py`` (plan,
submit, status, logs, cancel), ``client.py`` (the kubernetes client, imported only to talk to a
cluster), ``logs.py`` and ``pods.py``. Nothing is imported here, so the package costs nothing."""
