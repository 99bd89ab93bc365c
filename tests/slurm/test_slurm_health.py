"""Issue 34 on Slurm, nodes apart (``slurm/cluster.sh up --apart``): each node's runner samples its
ranks and sends them with its heartbeats, so a rank stopped with SIGSTOP on the second node is named
and, with stall.action: fail, ends the job with its allocation freed; a rank slowed on purpose is
named the straggler in status and top. Short stall timeouts through the test-only floor."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_slurm_apart import LOOP, _running_with_output
from test_slurm_target import status, submit, write_spec
from testkit import wait_for as wait_for_value
from testkit import wait_for_no_job_processes

pytestmark = [pytest.mark.slurm, pytest.mark.real]
TIMEOUT_S = 8
FLOOR = {"DDPJOB_TEST_STALL_MIN_S": "5"}


@pytest.fixture(autouse=True)
def _slurm_env(apart_cluster, monkeypatch):
    for key, value in {**apart_cluster.env, **FLOOR}.items():
        monkeypatch.setenv(key, value)
    return apart_cluster


def _rank(job_dir: Path, rank: int) -> dict | None:
    try:
        watch = json.loads((job_dir / "task-0" / "watch.json").read_text())
    except (OSError, ValueError):
        return None
    for node in watch.get("nodes", []):
        for r in (node.get("vitals") or {}).get("ranks", []):
            if r.get("rank") == rank:
                return {**r, "host": node.get("host")}
    return None


SLOW_RANK = """
import os, time
import torch
import torch.distributed as dist

def read_shard(rank):
    time.sleep(0.4 if rank == 1 else 0.0)  # rank 1's data path is slow
    return torch.ones(4) * rank

dist.init_process_group("gloo")
rank = dist.get_rank()
while not os.path.exists(os.environ["STOP"]):
    dist.all_reduce(read_shard(rank))
    print("step", flush=True)  # output: a run that prints nothing is a quiet one to the stall watch
dist.destroy_process_group()
"""


def test_a_stopped_rank_on_the_second_node_ends_the_job_naming_it(apart_cluster, cli, tmp_path, ddpjob_home):
    """SIGSTOP to rank 1 on n2 while the ranks all_reduce: with stall {timeout: 8, action: fail} the job
    ends FAILED naming rank 1 on node 1 (n2) within the timeout plus 30 s, Slurm no longer holds it and
    no process of the job is left."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    spec = write_spec(tmp_path, "stopfail", ["python", str(script)], stall={"timeout": TIMEOUT_S, "action": "fail"})
    job_id = submit(cli, str(spec))
    data = _running_with_output(cli, job_id)
    job_dir = Path(data["handle"]["job_dir"])
    rank = wait_for_value(lambda: _rank(job_dir, 1), "n2's vitals to reach the watch", timeout=30)
    assert rank["host"] == "n2" and rank["rss"] > 0, rank
    os.kill(rank["pid"], signal.SIGSTOP)
    failed = wait_for_value(lambda: (d := status(cli, job_id))["status"]["state"] == "FAILED" and d,
                            "the job to end FAILED", timeout=TIMEOUT_S + 30)
    message = failed["status"]["message"]
    assert f"rank 1 (local rank 0, pid {rank['pid']}) on node 1 (n2) is stopped" in message, message
    jid = failed["handle"]["slurm_job_id"]
    wait_for_value(lambda: not apart_cluster.run("squeue", "-h", "-j", jid, check=False).stdout.strip(),
                   "Slurm to free the allocation", timeout=30)
    wait_for_no_job_processes(ddpjob_home, "the stall ended the job", timeout=60)


def test_a_slowed_rank_on_the_second_node_is_named_the_straggler(apart_cluster, cli, tmp_path, ddpjob_home):
    """The trainer with rank 1 (n2) sleeping 50 ms in each step: within a minute of its first steps
    status names it the straggler, on node 1 (n2), and top flags it with every rank's CPU and memory."""
    spec = write_spec(tmp_path, "slow", ["python", "-m", "launcher.train", "--model", "mlp", "--train-size", "4000",
                                         "--batch-size", "8", "--epochs", "20", "--log-every", "50", "--slow-rank", "1",
                                         "--slow-rank-delay", "0.05"])
    from launcher.train.vitals import REPORT_S

    job_id = submit(cli, str(spec))
    job_dir = Path(wait_for_value(lambda: status(cli, job_id)["handle"].get("job_dir"), "the job's folder", timeout=60))
    wait_for_value((job_dir / "task-0" / "vitals" / "rank-1.json").exists, "rank 1's first step report", timeout=180)
    stepping = time.time() - REPORT_S  # its first report comes within REPORT_S of its first step
    data = wait_for_value(lambda: "straggler: rank 1 on node 1 (n2)" in (d := status(cli, job_id))["status"]["message"]
                          and d, "status to name the straggler", timeout=150)  # past the minute: the figure fails
    took = time.time() - stepping
    assert took <= 60, f"rank 1 named the straggler {took:.0f} s after its first steps, not within a minute: {data['status']['message']}"
    assert data["status"]["state"] == "RUNNING" and "short of compute" in data["status"]["message"], data["status"]
    top = cli("top", job_id, "--once", timeout=60).stdout
    rows = {line.split()[2]: line for line in top.splitlines() if line[:1].isdigit()}
    assert set(rows) == {"0", "1"} and "STRAGGLER" in rows["1"] and "n2" in rows["1"], top
    # RSS as top writes it (a rank of the trainer is near 1 GiB: "1013.5 MiB" or "1.0 GiB")
    assert all(re.search(r"\d (MiB|GiB) ", r) and "no GPU" in r for r in rows.values()), top
    assert cli("cancel", job_id, timeout=120).returncode == 0
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel", timeout=60)


def test_a_rank_held_back_by_sleeping_on_the_second_node_is_named_with_its_frame(apart_cluster, cli, tmp_path,
                                                                                ddpjob_home):
    """Issue 44 on Slurm, nodes apart: a plain gloo script whose rank 1 (n2) sleeps 0.4 s a step in its data
    path uses no more CPU than rank 0 waiting for it; n2's runner reads its rank's stack every 2 s (py-spy,
    beside the runner's Python) and status names rank 1 the straggler within 60 s of its first samples,
    with the frame it sleeps in."""
    from launcher.targets.shared.stacks import find_py_spy

    if find_py_spy() is None:
        pytest.skip("py-spy is not installed beside this Python (the dev extra has it)")
    script = tmp_path / "slowrank.py"
    script.write_text(SLOW_RANK)
    spec = write_spec(tmp_path, "sleepy", ["python", str(script)], env={"STOP": str(tmp_path / "stop")},
                      stall={"timeout": TIMEOUT_S})
    job_id = submit(cli, str(spec))
    data = wait_for_value(lambda: (d := status(cli, job_id))["status"]["state"] == "RUNNING" and d, "the job to run",
                          timeout=180)
    job_dir = Path(data["handle"]["job_dir"])
    wait_for_value(lambda: (_rank(job_dir, 1) or {}).get("frames"), "n2's first stack samples", timeout=120)
    sampling = time.time()
    # Where it sleeps: the line follows the samples (on a loaded machine the first may find it still importing).
    named = wait_for_value(lambda: "straggler: rank 1 on node 1 (n2)" in (m := (d := status(cli, job_id))["status"]["message"])
                           and "read_shard" in m and d, "status to name the sleeping rank in read_shard", timeout=90)
    took = time.time() - sampling
    message = named["status"]["message"]
    assert took <= 60, f"named {took:.0f} s after its first samples: {message}"
    assert f"is the one the others wait for: its stack was in read_shard ({script.name}:7)" in message, message
    # ddpjob stacks: each node's runner reads its own rank and answers through the shared job folder.
    asked = time.time()
    found = json.loads(cli("stacks", job_id, "-o", "json", timeout=60).stdout)
    assert time.time() - asked < 10 and found["note"] is None, found
    hosts = {r["rank"]: r["host"] for r in found["ranks"]}
    assert hosts == {0: "n1", 1: "n2"} and all(r["error"] is None for r in found["ranks"]), found
    for _ in range(5):  # one reading is one instant: rank 1 spends most of each step in read_shard, not all of it
        text = cli("stacks", job_id, "--rank", "1", timeout=60).stdout
        assert "rank 1 on node 1 (n2)" in text and "(slowrank.py:" in text, text
        if "read_shard (slowrank.py:7)" in text:
            break
    assert "read_shard (slowrank.py:7)" in text, text
    # Rank 1 stopped: the watch names it, asks every node's runner where its ranks are, and status says it.
    os.kill(next(r["pid"] for r in found["ranks"] if r["rank"] == 1), signal.SIGSTOP)
    placed = wait_for_value(lambda: " waits in " in (m := status(cli, job_id)["status"]["message"]) and m,
                            "status to say where the ranks are", timeout=TIMEOUT_S + 40)
    assert "stalled: rank 1 (local rank 0" in placed and "rank 1 stopped in " in placed, placed
    assert re.search(r"rank 0 waits in all_reduce \(torch/distributed/distributed_c10d\.py:\d+\) from slowrank\.py:13",
                     placed), placed
    kept = json.loads((job_dir / "task-0" / "stacks.json").read_text())
    assert {r["host"] for r in kept["ranks"]} == {"n1", "n2"}, kept
    assert cli("cancel", job_id, timeout=120).returncode == 0
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel", timeout=60)
