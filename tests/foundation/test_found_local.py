"""The local target end to end: real torchrun agents, real gloo process groups, real signals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import FAILER, SLEEPER, sigint_default, wait_for

from launcher.service.registry import Registry
from launcher.targets.shared import procs

RANKS = '''
import json, os
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
        "NCCL_SOCKET_IFNAME", "DDPJOB_SWEEP_INDEX", "DDPJOB_OUTPUT_DIR"]
rec = {k: os.environ.get(k) for k in keys}
rec["sum"] = t.item()
rec["argv"] = __import__("sys").argv[1:]
with open(os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "rank%d.json" % dist.get_rank()), "w") as f:
    json.dump(rec, f)
print("rank", dist.get_rank(), "sum", t.item(), flush=True)
dist.destroy_process_group()
'''


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    for name, text in {"ranks.py": RANKS, "sleeper.py": SLEEPER, "failer.py": FAILER}.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def job_id_of(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[0]


def status_json(cli, job_id: str) -> dict:
    proc = cli("status", job_id, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.real
def test_two_nodes_two_procs_ranks_and_all_reduce(cli, scripts):
    proc = cli("submit", "--nodes", "2", "--procs-per-node", "2", "-f", "--", "python", "ranks.py", "--tag", "$(id)", "a$$b", "$local_rank", cwd=scripts)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.split()[1]
    st = status_json(cli, job_id)
    assert st["state"] == "SUCCEEDED"
    out = Path(st["status"]["tasks"][0]["nodes"][0]["log"]).parent.parent / "output"
    recs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert sorted(int(r["RANK"]) for r in recs) == [0, 1, 2, 3]
    assert {r["WORLD_SIZE"] for r in recs} == {"4"}
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs} == {("127.0.0.1", str(st["port"]))}
    assert {r["GROUP_RANK"] for r in recs} == {"0", "1"} and [r["LOCAL_RANK"] for r in recs] == ["0", "1", "0", "1"]
    assert all(r["sum"] == 10.0 for r in recs)  # 1+2+3+4 over a real gloo all_reduce
    assert all(r["NCCL_SOCKET_IFNAME"] == "lo" and r["OMP_NUM_THREADS"] == "1" for r in recs)
    assert all(r["argv"] == ["--tag", "$(id)", "a$$b", "$local_rank"] for r in recs)  # no shell, no torchrun macros
    # logs: both nodes, every line traced to node and rank; filters work
    logs = cli("logs", job_id).stdout
    for rank in range(4):
        assert f"[node{rank // 2} rank{rank}] rank {rank} sum 10.0" in logs
    only = cli("logs", job_id, "--rank", "3").stdout.splitlines()
    assert only == ["[node1 rank3] rank 3 sum 10.0"]
    node0 = cli("logs", job_id, "--node", "0").stdout
    assert "[node0 rank1]" in node0 and "[node1" not in node0
    assert len(cli("logs", job_id, "--node", "1", "--tail", "1").stdout.splitlines()) == 1
    assert cli("wait", job_id).returncode == 0


@pytest.mark.real
def test_cancel_leaves_no_process_alive(cli, scripts, ddpjob_home):
    job_id = job_id_of(cli("submit", "-q", "--nodes", "2", "--", "python", "sleeper.py", cwd=scripts))
    run_dir = Registry(ddpjob_home).get(job_id).run_dir
    out = Path(run_dir) / "output"
    wait_for(lambda: (out / "started-0").exists() and (out / "started-1").exists(), "both workers to start")
    pids = procs.marked_pids("DDPJOB_JOB_ID", job_id)
    assert len(pids) >= 5  # supervisor + 2 agents + 2 workers
    st = status_json(cli, job_id)
    assert st["state"] == "RUNNING"
    proc = cli("cancel", job_id)
    assert proc.returncode == 0 and "CANCELLED" in proc.stdout
    assert [p for p in pids if procs.alive(p)] == []
    assert procs.marked_pids("DDPJOB_JOB_ID", job_id) == []
    assert status_json(cli, job_id)["state"] == "CANCELLED"
    again = cli("cancel", job_id)  # idempotent
    assert again.returncode == 0 and "already ended: CANCELLED" in again.stdout
    tail = cli("logs", job_id, "--tail", "3").stdout  # not torchrun's SignalException frames
    assert "File \"" not in tail and "torch/distributed" not in tail, tail
    assert cli("wait", job_id).returncode == 1


@pytest.mark.real
def test_failing_rank_fails_the_job_with_its_error(cli, scripts):
    proc = cli("submit", "--nodes", "2", "-f", "-q", "--", "python", "failer.py", cwd=scripts)
    assert proc.returncode == 1
    job_id = proc.stdout.strip().splitlines()[0]
    st = status_json(cli, job_id)
    assert st["state"] == "FAILED"
    assert "rank 1 exited with code 1" in st["message"]
    assert "boom: rank 1 could not open its shard" in st["message"]
    nodes = st["status"]["tasks"][0]["nodes"]
    assert nodes[1]["exit_code"] == 1
    assert procs.marked_pids("DDPJOB_JOB_ID", job_id) == []  # the healthy node was stopped too
    text = cli("status", job_id).stdout
    assert "state:    FAILED" in text and "boom" in text
    # The output leads with the user's error; torchrun's own tracebacks stay in the files (--verbose).
    shown = proc.stdout + proc.stderr
    assert "boom: rank 1 could not open its shard" in shown and "[node1] torchrun stopped: ChildFailedError" in shown
    assert "torch/distributed/elastic" not in shown and "Root Cause (first observed failure)" not in shown
    assert f"ddpjob logs {job_id} --verbose" in proc.stderr
    verbose = cli("logs", job_id, "--verbose").stdout
    assert "Root Cause (first observed failure)" in verbose and "torch/distributed/elastic" in verbose
    last = cli("logs", job_id, "--node", "1", "--tail", "2").stdout.splitlines()  # the tail of what is shown
    assert last[-1] == "[node1] torchrun stopped: ChildFailedError" and "boom" in last[0], last


@pytest.mark.real
def test_two_jobs_at_once_get_different_ports(cli, scripts):
    cmd = [sys.executable, "-m", "launcher", "submit", "-q", "--nodes", "2", "--", "python", "ranks.py"]
    procs_ = [subprocess.Popen(cmd, cwd=scripts, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    ids = [p.communicate(timeout=60)[0].strip() for p in procs_]
    assert all(p.returncode == 0 for p in procs_) and len(set(ids)) == 2
    for job_id in ids:
        assert cli("wait", job_id, "--timeout", "300").returncode == 0
    ports = {status_json(cli, j)["port"] for j in ids}
    assert len(ports) == 2


@pytest.mark.real
def test_sweep_runs_elements_in_turn_with_own_outputs(cli, scripts, tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"""
name: tiny-sweep
workdir: {scripts}
command: [python, ranks.py, --lr, "{{lr}}"]
nodes: 2
sweep:
  lr: [0.5, 0.25]
""")
    proc = cli("submit", str(spec), "-q", "-f")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[0]
    st = status_json(cli, job_id)
    tasks = st["status"]["tasks"]
    assert [t["state"] for t in tasks] == ["SUCCEEDED", "SUCCEEDED"]
    assert [t["params"] for t in tasks] == [{"lr": "0.5"}, {"lr": "0.25"}]
    starts = [tasks[i]["nodes"][0] for i in range(2)]
    assert starts[0]["pid"] != starts[1]["pid"]
    for i, lr in enumerate(["0.5", "0.25"]):
        rec = json.loads((Path(st["run_dir"]) / "output" / f"sweep-{i}" / "rank1.json").read_text())
        assert rec["argv"] == ["--lr", lr] and rec["DDPJOB_SWEEP_INDEX"] == str(i)
    logs = cli("logs", job_id, "--task", "1").stdout
    assert "[task1 node0 rank0]" in logs and "task0" not in logs
    bad = cli("logs", job_id, "--task", "5")
    assert bad.returncode == 2 and f"--task 5: {job_id} has 2 runs (valid: 0..1)" in bad.stderr  # a usage error


@pytest.mark.real
def test_wait_timeout_and_unknown_id(cli, scripts):
    job_id = job_id_of(cli("submit", "-q", "--", "python", "sleeper.py", cwd=scripts))
    proc = cli("wait", job_id, "--timeout", "1")
    assert proc.returncode == 124 and "keeps running" in proc.stderr
    assert cli("cancel", job_id).returncode == 0
    missing = cli("status", "nosuch-abcde")
    assert missing.returncode == 4 and "ddpjob list" in missing.stderr and "Traceback" not in missing.stderr
    listing = json.loads(cli("list", "-o", "json").stdout)
    assert [j["id"] for j in listing] == [job_id] and listing[0]["state"] == "CANCELLED"


RECORDED = '''
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("bad batch shape (3, 32) on rank 1")

main()
'''


@pytest.mark.real
def test_torchelastic_error_file_is_the_root_cause(cli, scripts):
    (scripts / "recorded.py").write_text(RECORDED)
    proc = cli("submit", "--nodes", "2", "-f", "-q", "--", "python", "recorded.py", cwd=scripts)
    assert proc.returncode == 1
    st = status_json(cli, proc.stdout.split()[0])
    assert "ValueError: bad batch shape (3, 32) on rank 1" in st["message"]
    error_file = Path(st["run_dir"]) / "task-0" / "node-1.error.json"
    assert json.loads(error_file.read_text())["message"]["message"].startswith("ValueError")


@pytest.mark.real
def test_ctrl_c_stops_following_but_not_the_job(scripts, ddpjob_home, cli):
    import signal

    p = subprocess.Popen([sys.executable, "-m", "launcher", "submit", "-f", "--", "python", "sleeper.py"],
                         cwd=scripts, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=sigint_default)  # noqa: PLW1509 (no threads here) a Ctrl-C reaches it, even under nohup
    reg = Registry(ddpjob_home)
    job_id = wait_for(lambda: reg.list() and reg.list()[0].handle and reg.list()[0].id, "the job to be recorded")
    out = Path(reg.get(job_id).run_dir) / "output"
    wait_for((out / "started-0").exists, "the worker to start")
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=30)
    assert p.returncode == 130
    assert f"{job_id} keeps running" in stderr and f"ddpjob cancel {job_id}" in stderr
    assert "Traceback" not in stderr
    assert status_json(cli, job_id)["state"] == "RUNNING"
    assert cli("cancel", job_id).returncode == 0


@pytest.mark.real
def test_readme_quickstart_on_two_local_nodes(cli):
    proc = cli("submit", "jobs/quickstart.yaml", "--target", "local", "--nodes", "2", "-f")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.split()[1]
    st = status_json(cli, job_id)
    assert st["state"] == "SUCCEEDED"
    out = Path(st["run_dir"]) / "output"
    losses = [m["loss"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if m["event"] == "step"]
    assert len(losses) >= 5 and losses[-1] < 0.5 * losses[0]  # the loss falls
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["eval_accuracy"] > 0.5
    logs = cli("logs", job_id).stdout
    assert "[node0 rank0] rank 0/2" in logs and "[node1 rank1] rank 1/2" in logs
    assert "[node0 rank0] done:" in logs


def test_processes_a_test_leaves_behind_are_stopped(tmp_path):
    """The autouse fixture's cleanup: a job's process under this registry is stopped; a process of
    the same home that runs no job (a Slurm daemon started from a test) is left alone."""
    from testkit import stop_leftovers

    home = tmp_path / "home"
    base = {**os.environ, "DDPJOB_HOME": str(home)}
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    job = subprocess.Popen(sleep, env={**base, "DDPJOB_JOB_ID": "leftover-abcde"})
    daemon = subprocess.Popen(sleep, env=base)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and job.pid not in procs.marked_pids("DDPJOB_HOME", str(home)):
            time.sleep(0.05)
        found, survivors = stop_leftovers(home)
        assert found == [job.pid] and survivors == []
        assert job.wait(timeout=10) is not None and daemon.poll() is None
    finally:
        job.kill()
        daemon.kill()
        job.wait()
        daemon.wait()


@pytest.mark.timeout(120)  # the bound of "at once": a wait the exit did not end would last 600 s
def test_the_follow_loop_wakes_when_the_supervisor_exits_and_then_sleeps_whole(monkeypatch):
    """``submit -f`` waits on the supervisor's pidfd: its exit ends the current wait at once, and
    later waits are whole again (no spinning on an fd that stays readable); a pid whose start
    time is not the recorded one is never waited on."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = procs.start_time(child.pid)
    with procs.ExitWaker(child.pid, started + 1) as other:  # the pid, but not the process recorded
        assert other.fd is None
    with procs.ExitWaker(child.pid, started) as waker:
        assert waker.fd is not None
        child.stdin.close()  # the child ends now
        waker.sleep(600)  # returns when it has ended
        assert child.poll() is not None
        slept: list[float] = []
        with monkeypatch.context() as m:
            m.setattr(procs.time, "sleep", slept.append)
            waker.sleep(0.3)
        assert slept == [0.3]  # a whole sleep, not a return at once on the fd of the process that ended
    child.wait()
