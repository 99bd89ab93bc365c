"""The checks of a Kubernetes job's objects before they are created: the PyTorchJob CRD found
(``crd``) and checked with the operator's rules (``schema``) and the API server's structural schema
check (``structural``), a TrainJob's webhook and CRD rules (``trainjob_rules``), and the checks and
the API server's verdicts at the spec's file:line:field (``check``). Nothing is imported here."""
