"""Issue 47 item 4 in containers: nothing outlives its job, through the engine's own means. A local job
with ``local.container: podman`` runs each node in a container (``podman run --rm --init``: its own PID
namespace and cgroup); a worker starts a daemon in a session of its own with an empty environment
(``tests/slurm/test_slurm_leftovers.py``'s worker) and exits 0, exits 1 or is cancelled. The test counts
the daemon's processes after the job ends: none is left, the engine ends them with the container.

No ddpjob code of its own guards this (the engine does it): the container sharing the host's PID
namespace (``--pid=host`` put in by a wrapper of podman, tried by hand) still leaves none, since podman's
cleanup kills the container's cgroup. The count sees the daemon while the job runs (2 processes,
asserted first), so it would see one left after it."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from enginekit import job_containers
from test_container_engine import ddpjob, status, submit, wait_end
from testkit import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from test_slurm_leftovers import LEAVER, _kill, daemons

pytestmark = [pytest.mark.real, pytest.mark.timeout(600)]


@pytest.mark.parametrize(("mode", "state"), [("exit0", "SUCCEEDED"), ("fail", "FAILED"), ("wait", "CANCELLED")])
def test_a_daemon_a_worker_leaves_ends_with_its_container(engine_image, tmp_path, mode, state):
    token = f"ddpjob-leftover-{uuid.uuid4().hex[:12]}"
    (tmp_path / "leaver.py").write_text(LEAVER)
    job = submit(tmp_path, engine_image, "--set", f"env.LEAVER_TOKEN={token}", "--set", f"env.LEAVER_MODE={mode}",
                 "--", "python", "leaver.py")
    try:
        wait_for(lambda: len(daemons(token)) == 2, "the daemon's 2 processes", timeout=120, poll=0.3)
        if mode == "wait":
            assert ddpjob("cancel", job, cwd=tmp_path, timeout=60).returncode == 0
            st = status(job, tmp_path)
        else:
            st = wait_end(job, tmp_path)
        assert st["state"] == state, st
        deadline = time.monotonic() + 10  # the kernel's kill of a namespace is done in moments
        while daemons(token) and time.monotonic() < deadline:
            time.sleep(0.3)
        left = daemons(token)
        assert not left, f"{len(left)} process(es) of the daemon outlived the {state} job: {left}"
        assert job_containers(Path(os.environ["DDPJOB_HOME"])) == []
    finally:
        _kill(daemons(token))
