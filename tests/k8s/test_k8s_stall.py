"""The stall watch on Kubernetes (issue 34): each pod runs ddpjob's pod runner in front of torchrun
(launcher/targets/k8s/podrun.py, carried in the pod's env), the first pod's runner serves its
watch.json, and status reads it through the API server's pod proxy. Real torchrun and gloo in the
loopback API server's pods; one rank is stopped with SIGSTOP.

Today's watch names the run (no node wrote output: a hung collective) or a silent node; naming the
stopped *rank* comes with per-rank sampling: then only ``STUCK`` below changes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import fake_apiserver
import pytest
from test_k8s_target import REPO, job_id_of, run

from launcher.targets.k8s import runner
from launcher.targets.k8s.payload import K8sHandle, K8sRun
from launcher.targets.k8s.podrun import STALL_EXIT
from launcher.targets.k8s.target import KubernetesTarget

STUCK = "no node has written output or made progress since"  # what status must name (the rank, with per-rank sampling)
TIMEOUT_S = 20  # stall.timeout: the spec's minimum

STEPS = """\
import sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
for step in range(10000):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {dist.get_rank()}", flush=True)
    time.sleep(0.5)
"""


def submit(script: Path, action: str) -> str:
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--nodes", "2",
                    "--procs-per-node", "1", "--set", f"command=[python, {script}]",
                    "--set", f"stall.timeout={TIMEOUT_S}", "--set", f"stall.action={action}")
    assert code == 0, out
    return job_id_of(out)


def status(job_id: str) -> dict:
    code, out = run("status", job_id, "-o", "json")
    assert code in (0, 1), out
    return json.loads(out)


def stop_a_rank(cluster: fake_apiserver.FakeCluster, job: str) -> int:
    """SIGSTOP the training process of the worker pod (node 1): the runner's torchrun's child."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = [p for p in cluster.pods_of(job) if p.rtype == "Worker" and p.proc is not None]
        if pods and b"step 2 rank 1" in bytes(pods[0].log):
            tree = fake_apiserver.descendants(pods[0].proc.pid)  # runner -> torchrun -> the rank
            rank = tree[-1]
            os.kill(rank, signal.SIGSTOP)
            return rank
        time.sleep(0.5)
    raise AssertionError(f"rank 1 never printed: {[bytes(p.log)[-500:] for p in cluster.pods_of(job)]}")


def wait_for(job_id: str, until, limit: float) -> dict:
    deadline = time.monotonic() + limit
    while True:
        st = status(job_id)
        if until(st) or time.monotonic() > deadline:
            return st
        time.sleep(1)


@pytest.fixture
def steps(tmp_path: Path) -> Path:
    path = tmp_path / "steps.py"
    path.write_text(STEPS)
    return path


@pytest.mark.real
def test_a_stopped_rank_is_named_by_status_within_the_stall_timeout(k8s_api, steps, tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_HOME", str(tmp_path / "home"))
    job_id = submit(steps, "report")
    rank = stop_a_rank(k8s_api.server, job_id)
    stopped = time.time()
    try:
        st = wait_for(job_id, lambda s: "stalled:" in s["message"], TIMEOUT_S + 30)
        assert STUCK in st["message"] and st["state"] == "RUNNING", st
        since = st["message"].split(STUCK, 1)[1].split()[0]  # HH:MM:SS, within a few seconds of the stop
        said = time.strptime(since, "%H:%M:%S")
        assert abs((said.tm_hour * 3600 + said.tm_min * 60 + said.tm_sec) - (
            time.localtime(stopped).tm_hour * 3600 + time.localtime(stopped).tm_min * 60
            + time.localtime(stopped).tm_sec)) % 86400 < 10, (since, st)
        # The same text in list; and the raw watch.json, as `top` will read it.
        code, out = run("list")
        assert STUCK in out, out
        watch = KubernetesTarget().read_watch(handle_of(job_id))
        assert watch is not None and watch["verdict"]["kind"] == "quiet" and len(watch["nodes"]) == 2, watch
    finally:
        os.kill(rank, signal.SIGCONT)
        run("cancel", job_id)


@pytest.mark.real
def test_stall_action_fail_ends_the_job_failed_naming_it_and_leaves_no_process(k8s_api, steps, tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_HOME", str(tmp_path / "home"))
    job_id = submit(steps, "fail")
    cluster = k8s_api.server
    trees = {p.name: [p.proc.pid, *fake_apiserver.descendants(p.proc.pid)] for p in cluster.pods_of(job_id) if p.proc}
    stop_a_rank(cluster, job_id)
    trees.update({p.name: [p.proc.pid, *fake_apiserver.descendants(p.proc.pid)] for p in cluster.pods_of(job_id)})
    st = wait_for(job_id, lambda s: s["state"] == "FAILED", TIMEOUT_S + 60)
    assert st["state"] == "FAILED" and st["message"].startswith("stalled: ") and STUCK in st["message"], st
    master = next(p for p in cluster.pods_of(job_id) if p.rtype == "Master")
    assert master.exit_code == STALL_EXIT and master.restarts == 0  # ExitCode: not restarted
    assert not [p.name for p in cluster.pods_of(job_id) if p.phase in ("Running", "Pending")]
    time.sleep(1)
    alive = [pid for pids in trees.values() for pid in pids if _alive(pid)]
    assert not alive, alive


def handle_of(job_id: str) -> K8sHandle:
    return K8sHandle(job_id=job_id, run_dir="", namespace="default", nodes=2, jobs=[K8sRun(0, job_id)],
                     watch_port=runner.DEFAULT_PORT + 1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
