"""The Kubernetes target: one Kubeflow PyTorchJob (kubeflow.org/v1) per run, or with ``k8s.api:
trainjob`` one Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1), created with the
official kubernetes client.

``options.py`` (the spec's ``k8s:`` section), ``payload.py`` (the payload, the handle and the
plan's text), ``target.py`` (plan, submit, status, logs, cancel), ``status.py`` (each run's state from
its object, its pods and the first pod's watch) and three rooms: ``objects/`` (the
one render loop, the two API flavours, the pod runner's bundle, the APIs as data: plain dicts,
pure), ``validation/`` (the CRD and the checks against it, at the spec's file:line:field) and
``cluster/`` (the kubernetes client, imported only to talk to a cluster, pods, logs, the first
pod's watch). What runs in the pods is in ``job/``. Nothing is imported here, so the package costs
nothing."""
