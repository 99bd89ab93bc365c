"""Issue 47 item 4 on Slurm: nothing outlives its job. A worker starts a daemon the scheduler cannot see
(its own session, an empty environment, its parent gone: a double fork), then exits 0, exits 1, or
waits to be cancelled. The test cluster tracks a step's processes by parentage
(``ProctrackType=proctrack/linuxproc``), as clusters without the cgroup plugin do, so only ddpjob's node
runner (``slurm/job/reaper.py``: a child subreaper that stops what is left under it) ends them.

Without the runner's reaper (``Reaper.start`` and ``Reaper.end`` returning at once; or only the
``prctl`` left out) each bare-node case fails: the daemon's 2 processes per node outlive the job (counted
by the token in their command line). In containers (``slurm.container.runtime`` oci and podman) the
engine ends them as well (runc's kill of the container's cgroup, podman's PID namespace and cgroup):
without the reaper the count passes there, and for oci only the node log's line on what the runner
stopped is missing, which fails (podman's case guards the engine alone: the container's removal may end
the runner before it writes)."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from test_slurm_containers import containers, image, shared, slurm_pids, spec_for  # noqa: F401 - the container cases' fixtures
from test_slurm_target import status, submit, wait_for, write_spec
from testkit import wait_for as wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.real]

# The worker: a daemon of two processes (the second ignores SIGTERM), started with setsid and a double
# fork and an empty environment, so neither the step's process tree, its process group nor the job's
# variables find it; then what LEAVER_MODE says.
LEAVER = """
import os, sys, time
code = ("import os, signal, time\\n"
        "if os.fork() == 0:\\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "time.sleep(600)\\n")
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.execve(sys.executable, [sys.executable, "-c", code, os.environ["LEAVER_TOKEN"]], {})
os.waitpid(pid, 0)
print("daemon started", flush=True)
mode = os.environ["LEAVER_MODE"]
if mode == "wait":
    time.sleep(600)
sys.exit(1 if mode == "fail" else 0)
"""


@pytest.fixture(autouse=True)
def _slurm_env(slurm_cluster, monkeypatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


def daemons(token: str) -> list[int]:
    """Live processes whose command line carries ``token`` (a zombie's is empty)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def said(log: Path) -> None:
    """The node's log says what its runner stopped, pid and name (within 10 s)."""
    pattern = re.compile(r"process\(es\) the job left running [^(]*\(pid \d+ python.*were stopped with it")
    wait_until(lambda: pattern.search(log.read_text(errors="replace")), f"{log.name} to say what was stopped",
               timeout=10, poll=0.3)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize(("mode", "nodes", "state"), [("exit0", 1, "SUCCEEDED"), ("fail", 1, "FAILED"),
                                                       ("wait", 2, "CANCELLED")])
def test_a_daemon_a_worker_leaves_ends_with_the_job(slurm_cluster, cli, tmp_path, mode, nodes, state):
    """The daemon's 2 processes on each node are gone once Slurm says the job ended (success, failure,
    cancel), and each node's log names what its runner stopped."""
    token = f"ddpjob-leftover-{uuid.uuid4().hex[:12]}"
    (tmp_path / "leaver.py").write_text(LEAVER)
    env = {"LEAVER_TOKEN": token, "LEAVER_MODE": mode}
    spec = write_spec(tmp_path, f"left-{mode}", ["python", str(tmp_path / "leaver.py")], nodes=nodes, env=env)
    job_id = submit(cli, str(spec))
    try:
        wait_until(lambda: len(daemons(token)) == 2 * nodes, f"the daemons on {nodes} node(s)", timeout=180)
        if mode == "wait":
            wait_for(cli, job_id, {"RUNNING"}, timeout=60)
            assert cli("cancel", job_id, timeout=120).returncode == 0
        data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
        assert data["status"]["state"] == state, data["status"]
        # Ended as Slurm says; Slurm's own SIGKILL of the step (KillWait 5 s) may still be under way.
        deadline = time.monotonic() + 20
        while daemons(token) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = daemons(token)
        assert not left, f"{len(left)} process(es) of the daemon outlived the {state} job: {left}"
        job_dir = Path(status(cli, job_id)["handle"]["job_dir"])
        for node in range(nodes):  # written as the last of them ends: a moment after the count saw none
            said(job_dir / "task-0" / f"node-{node}.log")
    finally:
        _kill(daemons(token))



@pytest.mark.parametrize("runtime", ["oci", "podman"])
def test_in_containers_a_daemon_ends_with_its_cancelled_job(slurm_cluster, cli, tmp_path, runtime, image, shared):  # noqa: F811
    """The same in Slurm's containers, cancelled (1 node, 2 workers: 4 daemon processes). oci shares the
    node's PIDs (a mount namespace only): the runner inside stops them as on the bare node, and runc's
    kill of the container's cgroup would. podman: the container's PID namespace and cgroup end with it
    (the task epilog removes the container)."""
    token = f"ddpjob-leftover-{uuid.uuid4().hex[:12]}"
    (tmp_path / "leaver.py").write_text(LEAVER)
    spec = spec_for(tmp_path, shared, image, runtime, f"left-{runtime}", ["python", str(tmp_path / "leaver.py")],
                    workdir=str(tmp_path), nodes=1, env={"LEAVER_TOKEN": token, "LEAVER_MODE": "wait"})
    job_id = submit(cli, str(spec))
    try:
        wait_until(lambda: len(daemons(token)) == 4, "the daemons of both workers", timeout=180)
        wait_for(cli, job_id, {"RUNNING"}, timeout=60)
        assert cli("cancel", job_id, timeout=120).returncode == 0
        data = wait_for(cli, job_id, {"CANCELLED"}, timeout=120)
        deadline = time.monotonic() + 20
        while daemons(token) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = daemons(token)
        assert not left, f"{len(left)} process(es) of the daemon outlived the job in {runtime}: {left}"
        if runtime == "oci":  # podman: the task epilog's removal of the container may end the runner first
            said(Path(data["handle"]["job_dir"]) / "task-0" / "node-0.log")
        sid = data["handle"]["slurm_job_id"]
        wait_until(lambda: not containers(slurm_cluster, runtime, job_id, sid), "the job's container to go", timeout=60)
        wait_until(lambda: not slurm_pids(sid), "the job's processes to end", timeout=60)
    finally:
        _kill(daemons(token))
