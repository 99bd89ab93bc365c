"""Issue 34 on the local target: every rank's health. The stall watch runs beside each local node
(launcher.targets.local.watch), a rank stopped with SIGSTOP is named in status and list, stall.action:
fail ends the job naming it with nothing left running; each rank's vitals (CPU, memory, output age)
are kept in watch.json; a rank slowed on purpose is named the straggler. Real torchrun processes
(gloo on CPU), short stall timeouts through the test-only floor (DDPJOB_TEST_STALL_MIN_S)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from testkit import job_pids, wait_for

from launcher.targets.shared.stacks import find_py_spy

TICKER = """
import os, time
while True:
    print("tick", os.environ["RANK"], flush=True)
    time.sleep(0.5)
"""
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10  # stall.timeout of these tests (the spec's floor of 20 s lowered for tests): a run is quiet
# from its start, and under load (two test workers) torchrun once took over 6 s to start the ticker's ranks
FLOOR = {"DDPJOB_TEST_STALL_MIN_S": "5"}


def _watch(run_dir: str) -> dict:
    try:
        return json.loads((Path(run_dir) / "task-0" / "watch.json").read_text())
    except (OSError, ValueError):
        return {}


def _rank_pid(run_dir: str, rank: int) -> int | None:
    for node in _watch(run_dir).get("nodes", []):
        for r in (node.get("vitals") or {}).get("ranks", []):
            if r.get("rank") == rank:
                return int(r["pid"])
    return None


def _start_ticker(cli, tmp_path: Path, action: str) -> tuple[str, str]:
    (tmp_path / "ticker.py").write_text(TICKER)
    job_id = cli("submit", "-q", "--nodes", "2", "--set", f"stall.timeout={TIMEOUT_S}", "--set",
                 f"stall.action={action}", "--", "python", "ticker.py", cwd=tmp_path, env=FLOOR, check=True).stdout.strip()
    run_dir = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["run_dir"]
    wait_for(lambda: _rank_pid(run_dir, 1), "the watch to see rank 1", timeout=60)
    return job_id, run_dir


def _said(cli, job_id: str, words: str) -> str | None:
    out = cli("status", job_id).stdout
    return out if words in out else None


@pytest.mark.real
def test_a_stopped_rank_is_named_in_status_and_list(cli, tmp_path):
    """SIGSTOP to rank 1 (node 1): within stall.timeout + 30 s status and list name that rank, its
    node and since when; the other rank still prints, so the run as a whole is not quiet."""
    job_id, run_dir = _start_ticker(cli, tmp_path, "report")
    assert "stopped" not in cli("status", job_id).stdout
    os.kill(_rank_pid(run_dir, 1), signal.SIGSTOP)
    def named() -> str | None:
        out = cli("status", job_id).stdout
        return out if "rank 1" in out else None

    status = wait_for(named, "status to name the stopped rank", timeout=TIMEOUT_S + 30)
    assert "RUNNING" in status and "on node 1" in status and "is stopped (SIGSTOP?) since" in status, status
    listed = cli("list", "-o", "json", check=True).stdout
    assert "rank 1 (local rank 0" in listed, listed
    if find_py_spy() is not None:  # where each rank is, read when the watch named it (issue 44 item 2)
        placed = wait_for(lambda: _said(cli, job_id, "stopped in"), "status to say where the stopped rank is",
                          timeout=30)
        assert "rank 1 stopped in ticker.py:5 <module>; rank 0 waits in <module> (ticker.py:5)" in placed, placed
        kept = json.loads((Path(run_dir) / "task-0" / "stacks.json").read_text())
        assert kept["verdict"]["rank"] == 1 and sorted(r["rank"] for r in kept["ranks"]) == [0, 1], kept
    cli("cancel", job_id, check=True)


DEADLOCK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
if dist.get_rank() == 0:
    dist.all_reduce(t)  # waits for rank 1 in an all-reduce it never enters
else:
    dist.recv(t, src=0)  # waits for a send rank 0 never makes
"""


@pytest.mark.real
def test_ranks_blocked_in_different_collectives_are_named_with_their_frames(cli, tmp_path):
    """A real deadlock (issue 44): rank 0 in an all-reduce, rank 1 in a recv. The run goes quiet, the
    watch names it, and status says where each rank waits, from their stacks read by py-spy (again while
    the stall stands: on a loaded machine the first read may find the ranks still importing torch)."""
    if find_py_spy() is None:
        pytest.skip("py-spy is not installed here (the dev extra has it)")
    (tmp_path / "deadlock.py").write_text(DEADLOCK)
    job_id = cli("submit", "-q", "--nodes", "2", "--set", f"stall.timeout={TIMEOUT_S}", "--", "python",
                 "deadlock.py", cwd=tmp_path, env=FLOOR, check=True).stdout.strip()
    try:
        status = wait_for(lambda: _said(cli, job_id, "waits in all_reduce"), "status to say where the ranks wait",
                          timeout=TIMEOUT_S + 60)
        assert "stalled: no node has written output" in status, status
        assert re.search(r"rank 0 waits in all_reduce \(torch/distributed/distributed_c10d\.py:\d+\) from deadlock\.py:6",
                         status), status
        assert re.search(r"rank 1 waits in recv \(torch/distributed/distributed_c10d\.py:\d+\) from deadlock\.py:8",
                         status), status
    finally:
        cli("cancel", job_id)


@pytest.mark.real
def test_stall_action_fail_ends_the_job_naming_the_stopped_rank(cli, tmp_path, ddpjob_home):
    """With stall.action: fail the job ends FAILED naming the stopped rank, and no process of it is left
    (the stopped one included: SIGTERM cannot end it)."""
    job_id, run_dir = _start_ticker(cli, tmp_path, "fail")
    os.kill(_rank_pid(run_dir, 1), signal.SIGSTOP)
    done = cli("wait", job_id, "--timeout", str(TIMEOUT_S + 30))
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    message = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["message"]
    assert "rank 1 (local rank 0" in message and "on node 1" in message and "stall.action: fail" in message, message
    wait_for(lambda: not job_pids(ddpjob_home), "no process of the job left", timeout=10)


TRAINER = ["python", "-m", "launcher.train", "--model", "mlp", "--train-size", "4000", "--batch-size", "8",
           "--epochs", "20", "--log-every", "50", "--slow-rank", "1", "--slow-rank-delay", "0.05"]


@pytest.mark.real
def test_a_slowed_rank_is_named_the_straggler_in_status_and_top(cli, tmp_path):
    """Rank 1 (node 1) sleeps 50 ms in each step's compute: within a minute of its first steps status
    names it as the straggler (node, by how much, short of compute), top flags it and shows CPU, memory
    and output age for every rank with "no GPU"; top -o json gives the same per node and rank, and
    after a cancel top still shows the last sample."""
    from launcher.train.vitals import REPORT_S

    job_id = cli("submit", "-q", "--nodes", "2", "--", *TRAINER, cwd=REPO, check=True).stdout.strip()
    run_dir = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["run_dir"]
    wait_for((Path(run_dir) / "task-0" / "vitals" / "rank-1.json").exists, "rank 1's first step report", timeout=120)
    stepping = time.time() - REPORT_S  # its first report comes within REPORT_S of its first step

    def named() -> str | None:
        out = cli("status", job_id).stdout
        return out if "straggler: rank 1 on node 1" in out else None

    status = wait_for(named, "status to name rank 1 the straggler", timeout=150)  # past the minute: the figure fails
    took = time.time() - stepping
    assert took <= 60, f"rank 1 named the straggler {took:.0f} s after its first steps, not within a minute: {status}"
    assert "short of compute" in status and "the others wait on it" in status, status
    top = cli("top", job_id, "--once", check=True).stdout
    rows = {line.split()[2]: line for line in top.splitlines() if line[:1].isdigit()}  # by RANK
    assert set(rows) == {"0", "1"}, top
    assert "STRAGGLER" in rows["1"] and "STRAGGLER" not in rows["0"], top
    # RSS as top writes it (a rank of the trainer is near 1 GiB: "1020.7 MiB" or "1.0 GiB")
    assert all(re.search(r"\d (MiB|GiB) ", r) and " ago" in r and "no GPU" in r for r in rows.values()), top
    data = json.loads(cli("top", job_id, "-o", "json", check=True).stdout)
    ranks = {r["rank"]: r for n in data["health"]["nodes"] for r in n["ranks"]}
    assert set(ranks) == {0, 1} and all(r["cpu_pct"] is not None and r["rss_bytes"] > 0 for r in ranks.values())
    # Rank 1's own time holds its 50 ms sleep and is the larger (rank 0's compute alone was 3-40 ms,
    # by the load: twice it was no sure bound)
    assert ranks[1]["flag"] == "straggler" and ranks[1]["own_ms"] >= 50 and ranks[1]["own_ms"] > ranks[0]["own_ms"], ranks
    cli("cancel", job_id, check=True)
    after = json.loads(cli("top", job_id, "-o", "json", check=True).stdout)
    assert after["state"] == "CANCELLED" and {r["rank"] for n in after["health"]["nodes"] for r in n["ranks"]} == {0, 1}
    # every node has ended: its ranks show it (torchrun ends 1 on the cancel's SIGTERM), not the last "sleeping"
    assert all(n["ended"] and r["state"] == "exited" and r["cpu_pct"] is None
               for n in after["health"]["nodes"] for r in n["ranks"]), after["health"]["nodes"]


BUSY = """
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 1:  # extra work in this rank's step only: the others wait on it in the all-reduce
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            pass
    step += 1
    if step % 5 == 0:
        print("step", step, flush=True)
"""


def _first_output(run_dir: str, node: int) -> float | None:
    """When this test first saw node ``node``'s rank print (its log's first ``[default0]:`` line)."""
    try:
        return time.time() if "[default0]:step" in (Path(run_dir) / "task-0" / f"node-{node}.log").read_text() else None
    except OSError:
        return None


@pytest.mark.real
def test_a_busy_rank_of_a_plain_ddp_script_is_named_the_straggler_by_its_cpu(cli, tmp_path, monkeypatch):
    """A DDP script of the user's own (gloo, no step reports) where rank 1 (node 1) burns 200 ms of
    CPU more in each step: within a minute of its first output, status names rank 1 on node 1 by its
    CPU use against the others', and top flags its row. Without py-spy (DDPJOB_PY_SPY empty), as on a
    machine where it is not installed: with it, the frames rule names the rank first whenever its
    samples come in before the CPU rule's (under load, as on two test workers)."""
    monkeypatch.setenv("DDPJOB_PY_SPY", "")
    (tmp_path / "busy.py").write_text(BUSY)
    job_id = cli("submit", "-q", "--nodes", "2", "--", "python", "busy.py", cwd=tmp_path, check=True).stdout.strip()
    run_dir = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["run_dir"]
    try:
        started = wait_for(lambda: _first_output(run_dir, 1), "rank 1 to step", timeout=120)
        def named() -> str | None:
            out = cli("status", job_id).stdout
            return out if "straggler: rank 1 on node 1" in out else None

        status = wait_for(named, "status to name rank 1 the straggler", timeout=120)
        took = time.time() - started
        assert took <= 60, f"rank 1 named {took:.0f} s after its first output, not within a minute: {status}"
        assert re.search(r"uses \d+% CPU against \d+% for the others", status) and "judged by CPU use" in status, status
        top = cli("top", job_id, "--once", check=True).stdout
        rows = {line.split()[2]: line for line in top.splitlines() if line[:1].isdigit()}  # by RANK
        assert "STRAGGLER" in rows["1"] and "STRAGGLER" not in rows["0"], top
    finally:
        cli("cancel", job_id)


# --------------------------------------------------------------------------- pure: the rules themselves

def _node(node: int, ranks: list[dict]) -> dict:
    return {"node": node, "host": f"h{node}", "vitals": {"node": node, "ranks": ranks}}


def _steps(rank: int, data: float, compute: float, comm: float, now: float) -> dict:
    return {"rank": rank, "local_rank": 0, "pid": 100 + rank, "state": "S",
            "steps": {"step": 10, "t": now, "data_ms": data, "compute_ms": compute, "comm_ms": comm}}


def test_straggler_needs_several_samples_apart_and_says_what_it_is_short_of():
    from launcher.targets.shared.straggle import SAMPLES, Straggle

    now = 1000.0
    slow_compute = [_node(0, [_steps(0, 1, 20, 50, now)]), _node(1, [_steps(1, 1, 70, 2, now)]),
                    _node(2, [_steps(2, 1, 21, 50, now)])]
    judge = Straggle()
    seen = [judge.judge(slow_compute, now + i) for i in range(SAMPLES)]
    assert all(not s for s in seen[:-1]), seen  # once apart is not yet a straggler
    (found,) = seen[-1]
    assert found["rank"] == 1 and found["node"] == 1 and found["short_of"] == "compute", found
    assert "rank 1 on node 1 (h1)" in found["message"] and "x3.3" in found["message"], found
    slow_data = [_node(0, [_steps(0, 1, 20, 50, now)]), _node(1, [_steps(1, 60, 20, 2, now)])]
    judge = Straggle()
    assert [judge.judge(slow_data, now + i) for i in range(SAMPLES)][-1][0]["short_of"] == "data"
    even = [_node(0, [_steps(0, 1, 20, 5, now)]), _node(1, [_steps(1, 1, 24, 5, now)])]
    judge = Straggle()
    assert [judge.judge(even, now + i) for i in range(SAMPLES + 2)][-1] == []
    stale = [_node(0, [_steps(0, 1, 20, 50, now - 600)]), _node(1, [_steps(1, 1, 70, 2, now - 600)])]
    judge = Straggle()
    assert [judge.judge(stale, now + i) for i in range(SAMPLES)][-1] == []  # old reports are no pace


def _used(rank: int, cpu: float | None, gpu: int | None = None, state: str = "S") -> dict:
    return {"rank": rank, "local_rank": 0, "pid": 100 + rank, "state": state, "cpu": cpu,
            **({"gpu": {"gpu": gpu, "mem_mib": 500.0}} if gpu is not None else {})}


def _used_node(node: int, ranks: list[dict], now: float, utils: dict[int, float] | None = None) -> dict:
    rec = _node(node, ranks)
    rec["vitals"]["t"] = now
    if utils is not None:
        rec["vitals"]["gpus"] = [{"index": i, "util": u} for i, u in utils.items()]
    return rec


def test_a_program_without_step_reports_is_judged_by_what_is_measured():
    """No step times: a rank using far more CPU than the others, SAMPLES in a row, is named with the
    figures measured; a rank using less CPU is not (a sleeping rank and its waiting peers look alike);
    a rank whose own GPU is far less busy than the others' is named, a busier one is not (NCCL keeps
    a waiting rank's GPU busy); ranks sharing a GPU, stopped ranks and stale samples are not judged."""
    from launcher.targets.shared.straggle import SAMPLES, Straggle

    now = 1000.0

    def last(nodes: list[dict], times: int = SAMPLES) -> list[dict]:
        judge = Straggle()
        return [judge.judge(nodes, now + i) for i in range(times)][-1]

    busy = [_used_node(0, [_used(0, 12.0)], now), _used_node(1, [_used(1, 95.0)], now),
            _used_node(2, [_used(2, 14.0)], now)]
    judge = Straggle()
    seen = [judge.judge(busy, now + i) for i in range(SAMPLES)]
    assert all(not s for s in seen[:-1]), seen
    (found,) = seen[-1]
    assert found["rank"] == 1 and found["node"] == 1 and found["measured"] == "cpu", found
    assert found["message"].startswith("rank 1 on node 1 (h1) uses 95% CPU against 13% for the others"), found
    assert "judged by CPU use" in found["message"], found
    idle = [_used_node(0, [_used(0, 95.0)], now), _used_node(1, [_used(1, 5.0)], now)]
    assert [f["rank"] for f in last(idle)] == [0]  # the busy one, never the idle one
    near = [_used_node(0, [_used(0, 10.0)], now), _used_node(1, [_used(1, 30.0)], now)]  # x3 but 20 points
    assert last(near) == []
    stopped = [_used_node(0, [_used(0, 10.0)], now), _used_node(1, [_used(1, 95.0, state="T")], now)]
    assert last(stopped) == []
    assert last([_used_node(0, [_used(0, 10.0)], now - 600), _used_node(1, [_used(1, 95.0)], now - 600)]) == []
    gpu = [_used_node(0, [_used(0, 50.0, gpu=0)], now, {0: 98.0}), _used_node(1, [_used(1, 50.0, gpu=0)], now, {0: 20.0}),
           _used_node(2, [_used(2, 50.0, gpu=0)], now, {0: 97.0})]
    (found,) = last(gpu)
    assert found["rank"] == 1 and found["measured"] == "gpu" and "keeps its GPU 20% busy against 98%" in found["message"]
    busier = [_used_node(0, [_used(0, 50.0, gpu=0)], now, {0: 20.0}), _used_node(1, [_used(1, 50.0, gpu=0)], now, {0: 99.0})]
    assert [f["rank"] for f in last(busier)] == [0]  # the less busy GPU's rank, never the busier one
    shared = [_used_node(0, [_used(0, 50.0, gpu=0), _used(1, 50.0, gpu=0), _used(2, 50.0, gpu=1)], now, {0: 20.0, 1: 99.0})]
    assert last(shared) == []  # ranks 0 and 1 share GPU 0: its use is not theirs apart
    mixed = [_node(0, [_steps(0, 1, 20, 50, now)]), _node(1, [_steps(1, 1, 70, 2, now)])]
    mixed[1]["vitals"]["ranks"][0]["cpu"] = 5.0
    mixed[0]["vitals"]["ranks"][0]["cpu"] = 95.0
    assert [f["rank"] for f in last(mixed)] == [1]  # step reports come first: the CPU rule is for programs without


def test_a_rank_stopped_past_the_timeout_is_stuck_and_parsed_for_top():
    from launcher.targets.shared.health import parse, table
    from launcher.targets.shared.heartbeat import report, stuck_ranks

    now = 1000.0
    stopped = {"rank": 3, "local_rank": 1, "pid": 42, "state": "T", "stopped_since": now - 30, "cpu": 0.0,
               "rss": 50 << 20, "output": now - 31}
    nodes = [_node(0, [{"rank": 0, "local_rank": 0, "pid": 41, "state": "R", "cpu": 99.0, "rss": 1 << 20,
                        "output": now - 1}]), _node(1, [stopped])]
    assert stuck_ranks(nodes, now, 40) == []
    (stuck,) = stuck_ranks(nodes, now, 20)
    assert stuck["rank"] == 3 and stuck["message"].startswith("rank 3 (local rank 1, pid 42) on node 1 (h1) is stopped")
    state = {"updated": now, "timeout": 20, "action": "report", "nodes": nodes, "stragglers": [],
             "verdict": {"kind": "stuck", "rank": 3, "node": 1, "message": stuck["message"]}}
    assert report(state, now) == f"stalled: {stuck['message']}"
    health = parse(state, now=now)
    ranks = {r.rank: r for n in health.nodes for r in n.ranks}
    assert ranks[3].flag == "stuck" and ranks[3].state == "stopped" and ranks[3].output_age_s == 31
    lines = table(health)
    assert lines[0].startswith("NODE") and "STUCK" in lines[2] and "50.0 MiB" in lines[2], lines


def test_the_ranks_of_a_node_that_ended_show_it_with_the_exit_code_known(tmp_path):
    """A node's exit record (the local node wrapper's, beside its log) turns its ranks' last mid-run
    sample into "exited": exit code 0 for each rank when its torchrun ended 0, the node's code or
    signal otherwise; a node still running (no code yet) keeps its sample."""
    from launcher.targets.shared.health import exit_records, parse, table

    now = 1000.0
    sample = {"local_rank": 0, "state": "S", "cpu": 40.0, "rss": 1 << 20, "output": now - 1}
    state = {"updated": now, "nodes": [_node(n, [{**sample, "rank": n, "pid": 40 + n}]) for n in range(4)]}
    records = [{"exit_code": 0, "signal": None}, {"exit_code": 1, "signal": None},
               {"exit_code": -15, "signal": "SIGTERM"}, {"exit_code": None, "started": now - 60}]
    logs = []
    for n, record in enumerate(records):
        (tmp_path / f"node-{n}.exit.json").write_text(json.dumps(record).ljust(1024))  # padded, as the wrapper writes
        logs.append((str(tmp_path / f"node-{n}.log"), str(tmp_path / f"torchrun-node-{n}")))
    ends = exit_records([*logs, (str(tmp_path / "node-4.log"), "")])
    assert ends[4] is None and ends[0] == records[0], ends
    health = parse(state, now=now, ends=ends)
    ranks = {r.rank: r for n in health.nodes for r in n.ranks}
    assert [(ranks[n].state, ranks[n].exit_code) for n in range(4)] == [
        ("exited", 0), ("exited", None), ("exited", None), ("sleeping", None)]
    assert ranks[0].cpu_pct is None and ranks[3].cpu_pct == 40.0
    lines = table(health)
    assert "exited 0" in lines[1] and "exited (node exit 1)" in lines[2] and "exited (node SIGTERM)" in lines[3], lines
    assert "sleeping" in lines[4], lines


def test_the_sampler_reads_each_worker_and_its_output_from_proc(tmp_path):
    """A real agent with two workers (RANK 0 and 1 in their environment): the sampler finds both,
    their state and memory, the age of each one's output from the prefixed log, and sees a SIGSTOP."""
    import subprocess
    import sys

    from launcher.targets.shared.vitals import Sampler

    log = tmp_path / "node-0.log"
    log.write_text("[default1]:hello\n")
    agent = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "env={**os.environ, 'RANK': str(r), 'LOCAL_RANK': str(r)}) for r in (0, 1)]\n"
        "time.sleep(60)\n")])
    sample: dict = {"ranks": []}
    try:
        sampler = Sampler(node=0, agent=agent.pid, log=str(log), steps_dir=None, gpu=False)
        def both() -> dict | None:
            got = sampler.sample()
            return got if len(got["ranks"]) == 2 else None

        sample = wait_for(both, "both workers", timeout=30)
        ranks = {r["rank"]: r for r in sample["ranks"]}
        assert ranks[1]["output"] is not None and ranks[0]["output"] is None, ranks
        assert all(r["rss"] > 0 and r["state"] in "RS" for r in ranks.values()), ranks
        os.kill(ranks[0]["pid"], signal.SIGSTOP)
        time.sleep(0.1)
        ranks = {r["rank"]: r for r in sampler.sample()["ranks"]}
        assert ranks[0]["state"] == "T" and "stopped_since" in ranks[0] and "stopped_since" not in ranks[1]
        assert sample["no_gpu"] == "no GPU (not sampled)"
    finally:
        for r in sample["ranks"]:
            os.kill(r["pid"], signal.SIGKILL)
        agent.kill()
        agent.wait()


def test_a_progress_line_keeps_what_the_watch_says_first():
    """list, wait's live line and logs -f's progress line show the stall watch's note before the steps
    (list cuts at 60 characters); other messages leave the progress line alone."""
    from launcher.core.progress import with_health

    assert with_health("step 3/9", "stalled: rank 1 on node 1 is stopped") == "stalled: rank 1 on node 1 is stopped; step 3/9"
    assert with_health("", "straggler: rank 1 on node 1") == "straggler: rank 1 on node 1"
    assert with_health("step 3/9", "retrying the port") == "step 3/9"


def test_a_node_not_heard_for_a_while_is_marked_silent_not_shown_as_current():
    """Issue 44 item 5: a frozen node's last sample was shown as current ("running 79%") until the stall
    timeout. A node the watch had not heard for more than SILENT_AFTER_S when it last wrote is flagged
    SILENT with that age, and a line under the table says its rows are its last sample; a node heard
    lately, one not heard yet, and one that has ended are not (the watch's own clock, both times)."""
    from launcher.targets.shared.health import SILENT_AFTER_S, notes, parse, table

    now = 1000.0
    rank = {"local_rank": 0, "state": "R", "cpu": 79.0, "rss": 1 << 20, "output": now - 1}
    nodes = [{**_node(n, [{**rank, "rank": n, "pid": 40 + n}]), "heard": heard}
             for n, heard in enumerate((now, now - 25, now - SILENT_AFTER_S + 1, None))]
    state = {"updated": now, "timeout": 300, "action": "report", "nodes": nodes, "stragglers": []}
    health = parse(state, now=now + 40)  # asked later: the job's watch is what the age is told from
    assert [n.silent_s for n in health.nodes] == [None, 25.0, None, None]
    lines = table(health)
    assert lines[2].endswith("SILENT 25s") and "running" in lines[2], lines
    assert not any("SILENT" in line for line in (lines[1], lines[3], lines[4])), lines
    assert notes(health) == ["node 1 (h1): not heard for 25s when the watch last wrote (its runner frozen, cut off "
                             "or gone): its rows are its last sample, not the present"]
    ended = parse(state, now=now, ends={1: {"exit_code": 0, "signal": None}})
    assert ended.nodes[1].silent_s is None and "SILENT" not in table(ended)[2]
    assert parse(state, now=now).to_json()["nodes"][1]["silent_s"] == 25.0  # top -o json and the dashboard
