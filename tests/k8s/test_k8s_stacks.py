"""Where every rank is, on Kubernetes (issue 44): each pod's runner reads its own ranks with py-spy in the
pod and serves them (launcher/targets/k8s/job/podstacks.py); ``ddpjob stacks`` asks every pod through the
API server's pod proxy, and the first pod's watch, when it names a stall, asks every pod over the pod
network and says in the verdict where the stuck rank stopped. The loopback cluster runs the pods as local
processes, so the runner finds py-spy beside its Python (the dev extra has it).

One real test, three jobs at once: one of each API (the same runner) whose rank 1 sleeps in its data
path, so its pod's frame sampler names it the straggler with its frame, then is stopped (SIGSTOP) and the
verdict names where; and a real deadlock (rank 0 in an all-reduce, rank 1 in a recv), whose quiet run's
verdict says where each rank waits. The pure tests below check the parts around it (a pod without py-spy, a silent pod, ptrace).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path

import fake_apiserver
import pytest
from test_k8s_stall import FLOOR, TIMEOUT_S, submit, wait_for
from test_k8s_target import run

from launcher.core.errors import TargetUnavailable
from launcher.targets.base import LogFilter
from launcher.targets.k8s.cluster.stacks import ask_stacks
from launcher.targets.k8s.job import podstacks
from launcher.targets.k8s.payload import K8sHandle, K8sRun
from launcher.targets.shared import stacks, vitals

SLOW_RANK = """\
import os, sys, threading, time
stepping = threading.Event()
def starting():  # torch's import and the rendezvous outlast the short stall timeout on a loaded machine
    while not stepping.wait(1.0):
        print("starting", flush=True)
threading.Thread(target=starting, daemon=True).start()
import torch, torch.distributed as dist

def read_shard(rank):
    time.sleep(0.4 if rank == 1 else 0.0)  # rank 1's data path is slow
    return torch.ones(4) * rank

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(100000):
    dist.all_reduce(read_shard(rank))
    stepping.set()
    print(f"step {step} rank {rank}", flush=True)
"""
SHARD_LINE, REDUCE_LINE = 10, 16  # read_shard's sleep, the loop's all_reduce in SLOW_RANK
DEADLOCK = """\
import threading, time
started = threading.Event()
def starting():  # said each second until the rendezvous: only the deadlock below is a stall
    while not started.wait(1.0):
        print("starting", flush=True)
threading.Thread(target=starting, daemon=True).start()
import torch, torch.distributed as dist
dist.init_process_group("gloo")
started.set()
print("in", flush=True)
t = torch.ones(1)
if dist.get_rank() == 0:
    dist.all_reduce(t)  # waits for rank 1 in an all-reduce it never enters
else:
    dist.recv(t, src=0)  # waits for a send rank 0 never makes
"""


def _rank_pid(cluster: fake_apiserver.FakeCluster, job: str) -> int:
    """The pid of rank 1 (node 1's pod: a PyTorchJob's Worker, a TrainJob's index 1), once it has stepped."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        pods = [p for p in cluster.pods_of(job) if p.rtype in ("Worker", "Node") and p.index == (p.rtype == "Node")
                and p.proc is not None]
        if pods and b"step 2 rank 1" in bytes(pods[0].log):
            return fake_apiserver.descendants(pods[0].proc.pid)[-1]  # runner -> torchrun -> the rank
        time.sleep(0.5)
    raise AssertionError(f"rank 1 never stepped: {[bytes(p.log)[-500:] for p in cluster.pods_of(job)]}")


def _stacks(job_id: str, *extra: str) -> tuple[int, str]:
    return run("stacks", job_id, *extra)


@pytest.mark.real
def test_stacks_of_every_pod_and_the_stall_verdict_names_the_stuck_ranks_frames(k8s_api, tmp_path, monkeypatch):
    if stacks.find_py_spy() is None:
        pytest.skip("py-spy is not installed beside this Python (the dev extra has it)")
    monkeypatch.setenv("DDPJOB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(*FLOOR)
    script = tmp_path / "slowrank.py"
    script.write_text(SLOW_RANK)
    (tmp_path / "deadlock.py").write_text(DEADLOCK)
    jobs = {api: submit(script, "report", api) for api in ("pytorchjob", "trainjob")}
    deadlocked = submit(tmp_path / "deadlock.py", "report")
    stopped: list[int] = []
    try:
        pids = {api: _rank_pid(k8s_api.server, job_id) for api, job_id in jobs.items()}
        for api, job_id in jobs.items():
            # ddpjob stacks: both pods answer through the pod proxy, each with its own rank read in the pod.
            code, out = _stacks(job_id, "-o", "json")
            assert code == 0, (api, out)
            found = json.loads(out)
            assert found["note"] is None and sorted((r["node"], r["rank"]) for r in found["ranks"]) == [(0, 0), (1, 1)], \
                (api, found)
            assert all(r["error"] is None and r["threads"] for r in found["ranks"]), (api, found)
            assert {r["rank"]: r["pid"] for r in found["ranks"]}[1] == pids[api], (api, found)
            code, text = _stacks(job_id, "--rank", "1", "-v")
            assert code == 0 and "rank 1 on node 1" in text and "rank 0 on" not in text, (api, text)
            assert f"slowrank.py:{REDUCE_LINE})" in text, (api, text)  # -v: the whole stack, the loop's line
            assert "thread MainThread" in text, (api, text)
        # Item 3: the pod's frame sampler (py-spy every few seconds) tells the watch where each rank spends its
        # time; rank 1 sleeps in read_shard, which uses no more CPU than rank 0 waiting in all_reduce for it.
        # The line follows the samples: on a loaded machine the first ones may find rank 1 still importing.
        for api, job_id in jobs.items():
            st = wait_for(job_id, lambda s: "straggler: rank 1 " in s["message"] and "read_shard" in s["message"], 120)
            assert f"its stack was in read_shard (slowrank.py:{SHARD_LINE})" in st["message"], (api, st)
        # Rank 1 stopped: the watch names it, asks every pod's runner where its ranks are, and status says it.
        for api in jobs:
            os.kill(pids[api], signal.SIGSTOP)
            stopped.append(pids[api])
        for api, job_id in jobs.items():
            st = wait_for(job_id, lambda s: " wait" in s["message"] and "stalled:" in s["message"], TIMEOUT_S + 60)
            message = st["message"]
            assert "stalled: rank 1 (local rank 0" in message and "rank 1 stopped in " in message, (api, message)
            assert re.search(r"rank 0 waits in all_reduce \(torch/distributed/distributed_c10d\.py:\d+\) "
                             rf"from slowrank\.py:{REDUCE_LINE}", message), (api, message)
            # The stopped rank is still read (py-spy without pausing it), beside the other pod's.
            code, out = _stacks(job_id, "-o", "json")
            found = json.loads(out)
            assert code == 0 and sorted(r["rank"] for r in found["ranks"] if r["threads"]) == [0, 1], (api, found)
        # A pod that does not answer is named: the API server's proxy fails for node 1's pod once.
        k8s_api.server.fail_next("GET", r"/pods/[^/]*worker-0[^/]*/proxy/stacks\.json", 503)
        code, out = _stacks(jobs["pytorchjob"])
        assert code == 0 and "rank 0 on node 0" in out and "rank 1 on" not in out, out
        assert re.search(r"note: pod\(s\) \S+-worker-0 \(node 1\) did not answer", out), out
        # The deadlock: the run is quiet, and the verdict says what each rank waits in (read again while the
        # stall stands: the first read, when the verdict came, may have found the ranks importing torch).
        message = wait_for(deadlocked, lambda s: "waits in all_reduce" in s["message"], TIMEOUT_S + 60)["message"]
        assert "stalled: no node has written output" in message, message
        assert re.search(r"rank 0 waits in all_reduce \(torch/distributed/distributed_c10d\.py:\d+\) from deadlock\.py:13",
                         message), message
        assert re.search(r"rank 1 waits in recv \(torch/distributed/distributed_c10d\.py:\d+\) from deadlock\.py:15",
                         message), message
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        for job_id in [*jobs.values(), deadlocked]:
            run("cancel", job_id)


# ------------------------------------------------------------------ the parts around it, without a cluster

class _Kube:
    """The calls ``ask_stacks`` makes: two running pods of run ``demo``, each answering ``answers[pod]``."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers

    def list_pods(self, selector: str) -> list[dict]:
        return [{"metadata": {"name": n}, "status": {"phase": "Running"}} for n in self.answers]

    def pod_proxy(self, name: str, port: int, path: str) -> bytes | None:
        assert (port, path) == (29501, "/stacks.json")
        said = self.answers[name]
        return json.dumps(said).encode() if said is not None else None


HANDLE = K8sHandle(job_id="demo", run_dir="", namespace="default", nodes=2, jobs=[K8sRun(0, "demo")], watch_port=29501)


def _answer(node: int, rank: int, **rank_fields: object) -> dict:
    frame = {"function": "read_shard", "file": "slowrank.py", "line": 10, "path": "/w/slowrank.py"}
    r = stacks.RankStack(node=node, rank=rank, local_rank=0, pid=100 + rank, host=f"h{node}")
    out = {"node": node, "host": f"h{node}", "py_spy": True, "ranks": [{
        **dataclasses.asdict(r), "threads": [{"name": "MainThread", "os_id": 1, "active": False, "frames": [frame]}]}]}
    out["ranks"][0].update(rank_fields)
    return out


def test_ask_stacks_reads_every_pod_and_names_the_silent_one():
    kube = _Kube({"demo-master-0": _answer(0, 0), "demo-worker-0": _answer(1, 1)})
    found = ask_stacks(kube, HANDLE, LogFilter())
    assert [(r.node, r.rank, r.innermost().short()) for r in found.ranks] == [
        (0, 0, "read_shard (slowrank.py:10)"), (1, 1, "read_shard (slowrank.py:10)")] and found.note is None
    assert [r.rank for r in ask_stacks(kube, HANDLE, LogFilter(rank=1)).ranks] == [1]
    kube.answers["demo-worker-0"] = None  # its runner is gone, or not up yet
    found = ask_stacks(kube, HANDLE, LogFilter())
    assert [r.rank for r in found.ranks] == [0] and found.note is not None
    assert found.note.startswith("pod(s) demo-worker-0 (node 1) did not answer"), found.note


def test_a_pod_without_py_spy_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv(stacks.PY_SPY_ENV, "")  # none: as in an image without py-spy
    monkeypatch.setattr(vitals, "ranks_of", lambda pid: (1, 0))  # the process is rank 1's still
    said = podstacks.answer(1, "h1", [{"rank": 1, "local_rank": 0, "pid": os.getpid()}])
    assert said["py_spy"] is False and said["ranks"][0]["error"] == podstacks.NOT_IN_IMAGE
    assert "pip install py-spy" in podstacks.NOT_IN_IMAGE and "Dockerfile" in podstacks.NOT_IN_IMAGE
    kube = _Kube({"demo-master-0": {**said, "node": 0}, "demo-worker-0": said})
    with pytest.raises(TargetUnavailable, match="py-spy is not installed in the pod's image"):
        ask_stacks(kube, HANDLE, LogFilter())


def test_ptrace_refused_is_said_in_a_users_words_with_the_pods_way_out(monkeypatch):
    def refused(py_spy, ranks, *args, **kwargs):
        for r in ranks:
            r.error = stacks.why_not("Error: Permission denied (os error 13)")
        return ranks

    monkeypatch.setattr(stacks, "find_py_spy", lambda: "/bin/py-spy")
    monkeypatch.setattr(stacks, "dump_all", refused)
    monkeypatch.setattr(vitals, "ranks_of", lambda pid: (0, 0) if pid == 1 else (None, None))  # pid 2: since gone
    said = podstacks.answer(0, "h0", [{"rank": 0, "local_rank": 0, "pid": 1}, {"rank": 1, "local_rank": 1, "pid": 2}])
    error = said["ranks"][0]["error"]
    assert error.startswith("not permitted to read another process (ptrace)") and podstacks.PTRACE_HINT in error, error
    assert said["ranks"][1]["error"].startswith("its process is gone or changed since the last sample"), said
    assert "securityContext.capabilities.add" in podstacks.PTRACE_HINT


def test_the_first_pods_watch_asks_every_pod_where_its_ranks_are(tmp_path):
    """``podstacks.where``: its own ranks in-process, the other pod's over HTTP at the address its heartbeats
    came from and the port its vitals name; one that does not answer is named."""
    other = podstacks.serve(fake_apiserver.free_port(), str(tmp_path / "none"),
                            lambda: _answer(1, 1, threads=[{"name": "MainThread", "os_id": 2, "active": False, "frames": [
                                {"function": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 9,
                                 "path": "/x/site-packages/torch/distributed/distributed_c10d.py"}]}]), print)
    assert other is not None
    try:
        where = podstacks.where(0, lambda: _answer(0, 0), 1, str(tmp_path / "stacks.json"))
        nodes = [{"node": 0, "address": None}, {"node": 1, "address": "127.0.0.1",
                                                 "vitals": {podstacks.PORT_KEY: other.server_address[1]}}]
        line = where({"kind": "stuck", "rank": 0}, nodes)
        assert line == ("rank 0 stopped in slowrank.py:10 read_shard; rank 1 waits in all_reduce "
                        "(torch/distributed/distributed_c10d.py:9)"), line
        assert json.loads(Path(tmp_path / "stacks.json").read_text())["verdict"] == {"kind": "stuck", "rank": 0}
        line = where({"kind": "stuck", "rank": 0}, [nodes[0], {**nodes[1], "node": 2}])  # another pod's answer
        assert line is not None and line.endswith("node(s) 2 did not answer (their pod's runner is gone, or the pod "
                                                  "network drops TCP to its port)"), line
        nodes[1]["vitals"] = {podstacks.PORT_KEY: fake_apiserver.free_port()}  # nothing listens there
        line = where({"kind": "stuck", "rank": 0}, nodes)
        assert line is not None and line.endswith("node(s) 1 did not answer (their pod's runner is gone, or the pod "
                                                  "network drops TCP to its port)"), line
    finally:
        other.shutdown()
