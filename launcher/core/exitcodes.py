"""Every exit code of ``ddpjob``, in a module of its own so that ``ddpjob --help`` (which lists them)
imports nothing else."""

from __future__ import annotations

# Every exit code of ``ddpjob``: its --help and docs/commands.md list these (a test keeps them in step).
EXIT_CODES: dict[int, str] = {
    0: "success (also when the reader of the output went away, e.g. `ddpjob logs ID | head`)",
    1: "the job failed or was cancelled (submit -f, wait)",
    2: "a wrong spec or command line (nothing is submitted)",
    3: "the target is unavailable or refused the job, or $DDPJOB_HOME or a file cannot be used",
    4: "unknown or ambiguous job id",
    5: "permission denied (Kubernetes 403: an admin applies the RBAC that `ddpjob docs k8s/rbac.yaml` prints)",
    6: "the training operator or Trainer is not installed: no PyTorchJob or TrainJob API (Kubernetes 404)",
    7: "a job of that name already exists (Kubernetes 409)",
    8: "the scheduler rejected the object as invalid (Kubernetes 422; its message is shown)",
    70: "a bug in ddpjob: please report it with the output of --debug",
    124: "wait timed out (the job keeps running)",
    130: "stopped with Ctrl-C (a submitted job keeps running)",
}
