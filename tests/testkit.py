"""Helpers for tests in any directory: reference material reached through DDPJOB_SHARED, and the
cleanup of processes a test leaves behind. Import by name (``from testkit import needs_crd``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Reference material outside the repository (the upstream PyTorchJob CRD, ...) reaches the tests
# only through DDPJOB_SHARED (.ci/run sets it when ../shared exists). Tests that need it skip with a
# reason without it, so a fresh clone passes; the product itself never looks there.
SHARED = Path(os.environ["DDPJOB_SHARED"]) if os.environ.get("DDPJOB_SHARED") else None
_CRD = SHARED / "reference" / "kubeflow" / "kubeflow.org_pytorchjobs.yaml" if SHARED else None
if os.environ.get("DDPJOB_PYTORCHJOB_CRD") is None and _CRD is not None and _CRD.exists():
    os.environ["DDPJOB_PYTORCHJOB_CRD"] = str(_CRD)
PYTORCHJOB_CRD = os.environ.get("DDPJOB_PYTORCHJOB_CRD")

# Under CI (CI=true) nothing skips: a missing CRD there is a broken setup, so those tests fail.
needs_crd = pytest.mark.skipif(
    not (PYTORCHJOB_CRD and Path(PYTORCHJOB_CRD).exists()) and os.environ.get("CI", "").lower() != "true",
    reason="needs the upstream PyTorchJob CRD: set DDPJOB_SHARED=<the shared/ folder> or DDPJOB_PYTORCHJOB_CRD=<file> "
    "(kubeflow.org_pytorchjobs.yaml of training-operator v1.9.x: see k8s/README.md for where to get it)",
)


def stop_leftovers(home: Path) -> tuple[list[int], list[int]]:
    """Stop the job processes (those with a DDPJOB_JOB_ID) started under registry ``home``.
    Returns (the pids found, those that survived)."""
    from launcher.targets.shared import procs

    left = [p for p in procs.marked_pids("DDPJOB_HOME", str(home)) if _runs_a_job(p)]
    return left, procs.terminate([(p, procs.start_time(p)) for p in left], grace=2.0) if left else []


def _runs_a_job(pid: int) -> bool:
    """A job's process (supervisor, agent, worker, pod) carries its id; Slurm's daemons do not."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(v.startswith(b"DDPJOB_JOB_ID=") for v in f.read().split(b"\0"))
    except OSError:
        return False
