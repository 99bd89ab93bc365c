"""Helpers for tests in any directory: reference material reached through DDPJOB_SHARED, and the
cleanup of processes a test leaves behind. Import by name (``from testkit import needs_crd``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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

    left = job_pids(home)
    return left, procs.terminate([(p, procs.start_time(p)) for p in left], grace=2.0) if left else []


def job_pids(home: Path) -> list[int]:
    """The job processes (supervisors, agents, workers, pods) started under registry ``home``."""
    from launcher.targets.shared import procs

    return [p for p in procs.marked_pids("DDPJOB_HOME", str(home)) if _runs_a_job(p)]


def wait_for_no_job_processes(home: Path, after: str, timeout: float = 30) -> None:
    """Every process of the jobs under ``home`` ends within ``timeout`` s of ``after`` (a cancel:
    schedulers stop a job's processes after they answer, so a test waits rather than looks once)."""
    wait_for(lambda: not job_pids(home), f"the job's processes to end after {after}", timeout=timeout)


def _runs_a_job(pid: int) -> bool:
    """A job's process (supervisor, agent, worker, pod) carries its id; Slurm's daemons do not."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(v.startswith(b"DDPJOB_JOB_ID=") for v in f.read().split(b"\0"))
    except OSError:
        return False


T = TypeVar("T")

# Job programs several tests run: each rank marks its start and sleeps; rank 1 fails after a second.
SLEEPER = '''
import os, time
open(os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "started-%s" % os.environ["RANK"]), "w").close()
print("sleeping", os.environ["RANK"], flush=True)
time.sleep(600)
'''
FAILER = '''
import os, time
print("hello from rank", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1":
    time.sleep(1)
    raise SystemExit("boom: rank 1 could not open its shard")
time.sleep(600)
'''


def wait_for(check: Callable[[], T], what: str, timeout: float = 120, poll: float = 0.2) -> T:
    """``check()``'s first true value; fails the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")
