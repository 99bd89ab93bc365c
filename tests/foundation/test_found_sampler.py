"""Corners of each node's sampler (launcher.targets.shared.vitals), issue 34.

A worker caught between fork and exec is not taken for what its environment then says (its agent's).

The GPU columns, as far as a machine without a GPU can take them: the runner's sampler reads
``nvidia-smi``'s CSV (a stand-in ``nvidia-smi`` on PATH prints what the real one prints for the same
queries), finds each rank's GPU by its pid where ``nvidia-smi`` lists it, and inside a container, where
the driver lists the host's pids, by the GPU UUID the trainer reports. The real GPU check is
``bash tests/bench/gpu_check.sh top`` (docs/commands.md)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from testkit import wait_for

GPU0 = "GPU-5b1f1d0e-7c3a-4e2b-9f61-0a8d2c4e6b10"
GPU1 = "GPU-e3a9c2d4-1b5f-4a7e-8c90-d1f2a3b4c5d6"
# What `nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits`
# prints on a 2-GPU node (a MIG or virtual GPU says [N/A] where it cannot measure).
DEVICES = f"0, {GPU0}, 97, 30210, 81559\n1, {GPU1}, [N/A], 4100, 81559\n"
FAKE_SMI = """#!/bin/sh
echo "$1" >> "$FAKE_SMI_DIR/calls"
case "$(cat "$FAKE_SMI_DIR/mode" 2>/dev/null)" in
  fail) echo "Unable to determine the device handle for GPU0000:41:00.0: Unknown Error" >&2; exit 255 ;;
  hang) exec sleep 30 ;;
esac
case "$1" in
  --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total) cat "$FAKE_SMI_DIR/devices" ;;
  --query-compute-apps=pid,gpu_uuid,used_memory) cat "$FAKE_SMI_DIR/apps" 2>/dev/null ;;
  *) echo "unexpected query: $*" >&2; exit 6 ;;
esac
"""


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi first on PATH; returns the folder whose `devices` and `apps` files it prints."""
    from launcher.targets.shared import vitals

    folder = tmp_path / "smi"
    (folder / "bin").mkdir(parents=True)
    exe = folder / "bin" / "nvidia-smi"
    exe.write_text(FAKE_SMI)
    exe.chmod(0o755)
    (folder / "devices").write_text(DEVICES)
    monkeypatch.setenv("PATH", f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_DIR", str(folder))
    monkeypatch.setattr(vitals, "GPU_EVERY_S", 0.0)  # asked at every sample, so each test sees its own answer
    return folder


def test_the_devices_and_processes_nvidia_smi_prints_are_read(smi):
    from launcher.targets.shared.vitals import gpus

    (smi / "apps").write_text(f"4242, {GPU1}, 1234\n777, GPU-not-on-this-node, 9\n")
    devices, procs, why = gpus()
    assert why is None
    assert devices == [{"index": 0, "uuid": "5b1f1d0e7c3a4e2b9f610a8d2c4e6b10", "util": 97.0, "mem_mib": 30210.0, "total_mib": 81559.0},
                       {"index": 1, "uuid": "e3a9c2d41b5f4a7e8c90d1f2a3b4c5d6", "util": None, "mem_mib": 4100.0, "total_mib": 81559.0}]
    assert procs == {4242: {"gpu": 1, "mem_mib": 1234.0}, 777: {"gpu": None, "mem_mib": 9.0}}
    (smi / "devices").write_text("")
    assert gpus()[2] == "no GPU (nvidia-smi lists none)"


def _cuda_stand_in(monkeypatch, uuid: str, reserved: int):
    """torch.cuda as the trainer sees it on a GPU whose UUID is ``uuid`` (the driver's 16 bytes, as
    torch's _CUuuid.bytes gives them) with ``reserved`` bytes held by PyTorch's allocator."""
    import torch

    raw = list(bytes.fromhex(uuid.removeprefix("GPU-").replace("-", "")))
    props = SimpleNamespace(uuid=SimpleNamespace(bytes=raw))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)


@pytest.mark.real  # imports torch (the drift check's pure tier has none)
def test_the_trainer_names_its_gpu_as_nvidia_smi_does(monkeypatch, tmp_path):
    """The trainer's UUID (torch's 16 bytes) and nvidia-smi's text meet in the same key; a CPU rank
    names none, nor does a GPU whose UUID torch gives without its bytes or as zeros; a CPU rank's report
    has no gpu field."""
    import torch

    from launcher.targets.shared.vitals import uuid_key
    from launcher.train.vitals import StepReport, gpu_identity

    assert gpu_identity(torch.device("cpu")) is None
    _cuda_stand_in(monkeypatch, GPU1, 3 << 30)
    assert gpu_identity(torch.device("cuda", 0)) == uuid_key(GPU1) == uuid_key(GPU1.upper())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(uuid=GPU1[4:]))
    assert gpu_identity(torch.device("cuda", 0)) is None  # a uuid without torch's bytes: not guessed from text
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(uuid=SimpleNamespace(bytes=[0] * 16)))
    assert gpu_identity(torch.device("cuda", 0)) is None  # a driver that does not say

    _cuda_stand_in(monkeypatch, GPU1, 3 << 30)
    monkeypatch.setenv("DDPJOB_VITALS_DIR", str(tmp_path))
    clock = SimpleNamespace(read=lambda: SimpleNamespace(data_ms=1.0, compute_ms=2.0, comm_ms=0.5))
    for device, name in ((torch.device("cuda", 0), 0), (torch.device("cpu"), 1)):
        report = StepReport(name, clock, device)  # type: ignore[arg-type]
        report.write(5)
    assert json.loads((tmp_path / "rank-0.json").read_text())["gpu"] == {"uuid": uuid_key(GPU1), "reserved_mib": 3072.0}
    assert "gpu" not in json.loads((tmp_path / "rank-1.json").read_text())


def test_each_rank_gets_its_gpu_by_pid_or_inside_a_container_by_the_trainers_uuid(smi, monkeypatch, tmp_path):
    """A real agent with two workers. Rank 1's pid is on nvidia-smi's list (on the host): its GPU and the
    memory nvidia-smi gives. Rank 0's is not (its pid is the container's, nvidia-smi's are the host's),
    but its trainer's report names GPU 1: that GPU, with the memory PyTorch holds. With neither, a rank
    has no GPU, and the note under the table says why; top's table and notes show all of it."""
    from launcher.targets.shared.health import notes, parse, table
    from launcher.targets.shared.vitals import Sampler, uuid_key

    steps = tmp_path / "steps"
    steps.mkdir()
    # What the trainer reports on GPU 1 (the record test_the_trainer_names_its_gpu_as_nvidia_smi_does holds it to).
    (steps / "rank-0.json").write_text(json.dumps({"step": 7, "t": time.time(), "step_ms": 3.5, "data_ms": 1.0, "compute_ms": 2.0,
                                                   "comm_ms": 0.5, "gpu": {"uuid": uuid_key(GPU1), "reserved_mib": 2048.0}}))
    agent = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "env={**os.environ, 'RANK': str(r), 'LOCAL_RANK': str(r)}) for r in (0, 1)]\n"
        "time.sleep(60)\n")])
    pids: list[int] = []
    try:
        sampler = Sampler(node=0, agent=agent.pid, log=None, steps_dir=str(steps))
        first = wait_for(lambda: (lambda s: s if len(s["ranks"]) == 2 else None)(sampler.sample()), "both workers", timeout=30)
        pids = [r["pid"] for r in first["ranks"]]
        by_rank = {r["rank"]: r["pid"] for r in first["ranks"]}
        (smi / "apps").write_text(f"{by_rank[1]}, {GPU0}, 1500\n99999999, {GPU1}, 2600\n")
        sample = sampler.sample()
        ranks = {r["rank"]: r for r in sample["ranks"]}
        assert ranks[1]["gpu"] == {"gpu": 0, "mem_mib": 1500.0, "seen_by": "nvidia-smi"}, ranks
        assert ranks[0]["gpu"] == {"gpu": 1, "mem_mib": 2048.0, "seen_by": "trainer"}, ranks
        assert ranks[0]["steps"]["step"] == 7 and "gpu" not in ranks[0]["steps"] and "steps" not in ranks[1]
        assert [d["index"] for d in sample["gpus"]] == [0, 1] and "no_gpu" not in sample

        health = parse({"nodes": [{"node": 0, "host": "n1", "heard": time.time(), "vitals": sample}]})
        rows = {line.split()[2]: line for line in table(health)[1:]}  # by rank
        assert rows["0"].split()[-4:] == ["1", "-", "2048", "MiB"], rows  # GPU 1 cannot say its use: [N/A]
        assert rows["1"].split()[-4:] == ["0", "97", "1500", "MiB"], rows
        assert {r.rank: r.gpu_seen_by for r in health.nodes[0].ranks} == {0: "trainer", 1: "nvidia-smi"}
        assert notes(health) == ["node 0 GPUs: #0 97% busy, 29.5 of 79.6 GiB; #1 -% busy, 4.0 of 79.6 GiB"]

        (smi / "apps").write_text(f"{by_rank[0]}, {GPU0}, [N/A]\n")  # the driver lists the pid, not its memory
        assert {r["rank"]: r.get("gpu") for r in sampler.sample()["ranks"]} == {
            0: {"gpu": 0, "mem_mib": 2048.0, "seen_by": "nvidia-smi; memory: trainer"}, 1: None}

        (smi / "apps").write_text(f"99999999, {GPU1}, 2600\n")  # a program that reports nothing, in a container
        (steps / "rank-0.json").unlink()
        health = parse({"nodes": [{"node": 0, "heard": time.time(), "vitals": sampler.sample()}]})
        assert all(r.gpu is None for r in health.nodes[0].ranks)
        assert all(line.split()[-2:] == ["-", "-"] for line in table(health)[1:]), table(health)
        assert notes(health)[1] == ("node 0: nvidia-smi lists none of its ranks' processes (in a container it lists the "
                                    "host's pids; ddpjob's trainer on a GPU names its own)")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        agent.kill()
        agent.wait()


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_an_nvidia_smi_that_fails_or_hangs_is_asked_again_only_a_minute_later(smi, monkeypatch, mode):
    """The sample runs in the heartbeat's thread: an nvidia-smi that fails (a GPU fault) or hangs past
    its timeout is not asked again at every sample, and the node says why it has no GPU columns."""
    from launcher.targets.shared import vitals

    monkeypatch.setattr(vitals, "SMI_TIMEOUT_S", 0.2)
    monkeypatch.setattr(vitals, "GPU_RETRY_S", 0.5)  # a minute outside tests
    (smi / "mode").write_text(mode)
    sampler = vitals.Sampler(node=0, agent=None, log=None, steps_dir=None)
    t0 = time.monotonic()
    first = sampler.sample()
    assert time.monotonic() - t0 < 5, "the hung nvidia-smi was not cut at its timeout"
    assert first["no_gpu"].startswith("no GPU (nvidia-smi failed: "), first
    assert ("timed out" in first["no_gpu"]) == (mode == "hang") and "gpus" not in first
    for _ in range(3):
        assert sampler.sample()["no_gpu"] == first["no_gpu"]
    assert len((smi / "calls").read_text().split()) == 1  # asked once, not at each sample
    (smi / "mode").write_text("")
    time.sleep(0.6)
    again = sampler.sample()
    assert again["gpus"][0]["util"] == 97.0 and "no_gpu" not in again  # asked again once the pause is over


def test_a_worker_seen_between_fork_and_exec_is_read_again_once_it_is_one():
    """The sampler reads each worker's RANK and LOCAL_RANK from its environment. A worker sampled
    between fork and exec still has its agent's environment, which in a PyTorchJob pod holds RANK (the
    node's): it must neither be taken for that rank nor be left out for good. Sampling as fast as it
    can while an agent (RANK=5 in its environment, as there) starts 8 workers, twice, every worker is
    found with its own rank."""
    from launcher.targets.shared.vitals import Sampler

    for _ in range(2):
        agent = subprocess.Popen([sys.executable, "-c", (
            "import os, subprocess, sys, time\n"
            "time.sleep(0.1)\n"
            "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], "
            "env={**os.environ, 'RANK': str(r), 'LOCAL_RANK': str(r)}) for r in range(8)]\n"
            "time.sleep(30)\n")], env={**os.environ, "RANK": "5"})
        pids: list[int] = []
        try:
            sampler = Sampler(node=0, agent=agent.pid, log=None, steps_dir=None, gpu=False)
            seen: set[tuple[int, int]] = set()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:
                ranks = sampler.sample()["ranks"]
                seen |= {(r["rank"], r["local_rank"]) for r in ranks}
                pids = [r["pid"] for r in ranks]
                if len(ranks) == 8:
                    break
            assert sorted((r["rank"], r["local_rank"]) for r in sampler.sample()["ranks"]) == [(r, r) for r in range(8)]
            assert seen == {(r, r) for r in range(8)}, seen  # never a wrong rank, not even once
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            agent.kill()
            agent.wait()


def test_what_the_sampler_keeps_of_ended_workers_is_dropped():
    """A long job whose workers come and go (torchrun restarts them) must not grow the sampler's books,
    and a pid the kernel gives again later must start afresh: after 12 workers that each lived a moment,
    it keeps only the live one's pid."""
    from launcher.targets.shared.vitals import Sampler

    agent = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        "for i in range(12):\n"
        "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.05)'], env={**os.environ, 'RANK': '0', 'LOCAL_RANK': '0'})\n"
        "last = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], env={**os.environ, 'RANK': '0', 'LOCAL_RANK': '0'})\n"
        "print(last.pid, flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    last = 0
    try:
        sampler = Sampler(node=0, agent=agent.pid, log=None, steps_dir=None, gpu=False)
        seen: set[int] = set()
        while agent.stdout is not None and not last:
            seen |= {r["pid"] for r in sampler.sample()["ranks"]}
            ready = select.select([agent.stdout], [], [], 0.05)[0]
            last = int(agent.stdout.readline()) if ready else 0
        wait_for(lambda: [r["pid"] for r in sampler.sample()["ranks"]] == [last] or None, "the last worker", timeout=20)
        assert len(seen) >= 4, seen  # it did see workers come and go
        assert set(sampler._ids) == set(sampler._cpu) == {last} and not sampler._stopped
    finally:
        if last:
            os.kill(last, signal.SIGKILL)
        agent.kill()
        agent.wait()
