"""``ddpjob stacks`` (issue 44, item 1, the local target): every rank's Python stack read from outside by
py-spy. The real test runs a plain 2-node gloo script whose rank 1 is held back in its own data path
(a sleep in ``read_shard``) and reads both ranks where they are: rank 1 in ``read_shard``, rank 0 in the
all-reduce waiting for it. The pure ones hold py-spy's output, its errors and the text to what they
must say."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path

import pytest
from testkit import wait_for

from launcher.cli.stacks import lines
from launcher.targets.shared import stacks

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
dist.destroy_process_group()
"""

DUMP = [  # py-spy dump --json of a rank (0.4.3), cut to what is read
    {"pid": 7, "thread_id": 1, "thread_name": "pt_autograd_0", "os_thread_id": 9, "active": False,
     "frames": [{"name": "wait", "filename": "/usr/lib/python3.11/threading.py", "short_filename": "threading.py",
                 "line": 327}]},
    {"pid": 7, "thread_id": 2, "thread_name": "MainThread", "os_thread_id": 7, "active": True,
     "frames": [{"name": "read_shard", "filename": "/w/data.py", "short_filename": "data.py", "line": 88},
                {"name": "<module>", "filename": "/w/train.py", "short_filename": "train.py", "line": 3}]},
]


def test_a_dump_is_read_innermost_frame_first_and_the_main_thread_leads():
    rank = stacks.RankStack(node=1, rank=3, local_rank=1, pid=7, host="n2", threads=stacks.parse(DUMP))
    assert rank.main() is rank.threads[1] and rank.innermost() == stacks.Frame("read_shard", "data.py", 88, "/w/data.py")
    text = lines(stacks.JobStacks(task=0, ranks=[rank]))
    assert text == ["task 0: 1 rank(s)", "rank 3 on node 1 (n2), pid 7:",
                    "  MainThread (active): read_shard (data.py:88) < <module> (train.py:3)",
                    "  pt_autograd_0 (idle): wait (threading.py:327)"], text
    verbose = lines(stacks.JobStacks(task=0, ranks=[rank]), verbose=True)
    assert verbose[2:5] == ["  thread MainThread (active, tid 7)", "    read_shard (/w/data.py:88)",
                            "    <module> (/w/train.py:3)"], verbose
    assert stacks.parse({"not": "a list"}) == [] and stacks.parse([{"frames": [{}]}])[0].frames[0].line == 0


@pytest.mark.parametrize(("said", "means"), [
    ("Error: Permission denied (os error 13)", "not permitted to read another process (ptrace)"),
    ("Error: Operation not permitted (os error 1)", "CAP_SYS_PTRACE"),
    ("Error: No such process (os error 3)", "the process has ended"),
    ("Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow", "not a Python process"),
    ("Error: something new\n\nStack backtrace:\n   0: x", "py-spy could not read it: Error: something new"),
])
def test_what_py_spy_cannot_do_is_said_in_a_users_words(said, means):
    assert means in stacks.why_not(said)


def test_the_py_spy_used_is_the_one_named_else_beside_python_else_on_the_path(tmp_path, monkeypatch):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(stacks.PY_SPY_ENV, str(fake))
    assert stacks.find_py_spy() == str(fake)
    read = stacks.dump(str(fake), stacks.RankStack(node=0, rank=0, local_rank=0, pid=os.getpid()))
    assert read.threads == [] and read.error is not None and "ptrace" in read.error
    monkeypatch.setenv(stacks.PY_SPY_ENV, "")  # set but empty: none, whatever else is installed
    assert stacks.find_py_spy() is None
    monkeypatch.setenv(stacks.PY_SPY_ENV, str(tmp_path / "absent"))
    assert stacks.find_py_spy() is None
    monkeypatch.delenv(stacks.PY_SPY_ENV)
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        assert stacks.find_py_spy() == str(beside)


def _needs_py_spy() -> str:
    found = stacks.find_py_spy()
    if found is None:
        pytest.skip("py-spy is not installed here (the dev extra has it): " + stacks.HOW_TO_GET)
    return found


@pytest.mark.real
def test_stacks_shows_the_slow_rank_in_its_data_path_and_the_other_waiting_for_it(cli, tmp_path):
    _needs_py_spy()
    (tmp_path / "slowrank.py").write_text(SLOW_RANK)
    stop = tmp_path / "stop"
    job_id = cli("submit", "-q", "--nodes", "2", "--set", f"env.STOP={stop}", "--", "python", "slowrank.py",
                 cwd=tmp_path, check=True).stdout.strip()
    try:
        def both() -> dict | None:  # each node's runner has sampled its rank, and both ranks run their loop
            proc = cli("stacks", job_id, "-o", "json")
            if proc.returncode != 0:
                return None
            found = json.loads(proc.stdout)
            tops = {r["rank"]: [f["function"] for t in r["threads"] for f in t["frames"]] for r in found["ranks"]}
            return found if len(tops) == 2 and "read_shard" in tops.get(1, []) else None

        found = wait_for(both, "both ranks read, rank 1 in read_shard", timeout=120, poll=1.0)
        assert found["id"] == job_id and found["task"] == 0
        by_rank = {r["rank"]: r for r in found["ranks"]}
        assert {r["node"] for r in found["ranks"]} == {0, 1} and all(r["error"] is None for r in found["ranks"])
        main = {k: next(t for t in r["threads"] if t["name"] == "MainThread") for k, r in by_rank.items()}
        assert main[1]["frames"][0]["function"] == "read_shard" and main[1]["frames"][0]["file"] == "slowrank.py"
        assert "all_reduce" in [f["function"] for f in main[0]["frames"]], main[0]  # waiting for rank 1

        for _ in range(5):  # one reading is one instant: rank 1 spends most of each step in read_shard, not all
            text = cli("stacks", job_id, check=True).stdout
            assert "rank 1 on node 1" in text and "rank 0 on node 0" in text, text
            if "MainThread (idle): read_shard (slowrank.py:7) <" in text:
                break
        assert "MainThread (idle): read_shard (slowrank.py:7) <" in text, text
        for _ in range(5):
            one = cli("stacks", job_id, "--rank", "1", "-v", check=True).stdout
            assert "rank 0" not in one and f"({tmp_path}/slowrank.py:" in one, one
            if f"    read_shard ({tmp_path}/slowrank.py:7)" in one:
                break
        assert f"    read_shard ({tmp_path}/slowrank.py:7)" in one, one

        missing = cli("stacks", job_id, env={stacks.PY_SPY_ENV: ""})
        assert missing.returncode == 3 and "pip install 'ddpjob[stacks]'" in missing.stderr, missing.stderr
    finally:
        stop.touch()
    assert "SUCCEEDED" in cli("wait", job_id, "--timeout", "60").stdout
    ended = cli("stacks", job_id)
    assert ended.returncode == 3 and "no live rank to read" in ended.stderr and "Traceback" not in ended.stderr


def _rank(rank: int, *frames: tuple[str, str, int], error: str | None = None) -> stacks.RankStack:
    return stacks.RankStack(node=rank, rank=rank, local_rank=0, pid=100 + rank, error=error, threads=[] if error else [
        stacks.Thread("MainThread", 100 + rank, False, [stacks.Frame(fn, path.rsplit("/", 1)[-1] if "site-packages" not in
                                                                     path else path.split("site-packages/")[1], line, path)
                                                        for fn, path, line in frames])])


def test_the_summary_says_where_the_stuck_rank_stopped_and_what_the_others_wait_in():
    c10d = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    ranks = [_rank(0, ("all_reduce", c10d, 3913), ("step", "/w/train.py", 40)),
             _rank(1, ("read_shard", "/w/data.py", 88), ("step", "/w/train.py", 38)),
             _rank(2, ("all_reduce", c10d, 3913), ("step", "/w/train.py", 40)),
             _rank(3, error="the process has ended")]
    assert stacks.summary(ranks, stuck=1) == (
        "rank 1 stopped in data.py:88 read_shard; ranks 0,2 wait in all_reduce "
        "(torch/distributed/distributed_c10d.py:3913) from train.py:40; rank 3 not read: the process has ended")
    assert stacks.summary(ranks[:1]) == "rank 0 waits in all_reduce (torch/distributed/distributed_c10d.py:3913) from train.py:40"


def test_the_watch_asks_where_once_per_verdict_and_status_says_it():
    import threading

    from launcher.targets.shared.heartbeat import Watch, report

    asked: list[dict] = []
    answered = threading.Event()

    def where(verdict: dict, nodes: list[dict]) -> str:
        asked.append(verdict)
        answered.set()
        return "rank 1 stopped in data.py:88 read_shard"

    w = Watch(port=0, nodes=2, host="h", outputs=[], timeout=5, action="report", state_path="/nonexistent/w.json",
              on_stall=lambda m: None, where=where)
    verdict = {"kind": "stuck", "node": 1, "rank": 1, "since": 1.0, "message": "rank 1 ... is stopped"}
    w._placed(verdict)
    assert answered.wait(5) and "where" not in verdict  # asked in a thread: said from the next tick on
    again = dict(verdict)  # the next tick's verdict: the same stall
    wait_for(lambda: w._placed(again) or "where" in again, "the answer to be kept", timeout=5, poll=0.05)
    w._placed({**verdict, "since": 1.0})
    assert len(asked) == 1, asked
    assert report({"verdict": again, "action": "report"}, 2.0) == (
        "stalled: rank 1 ... is stopped; rank 1 stopped in data.py:88 read_shard")
    w._placed({**verdict, "rank": 0, "since": 9.0})  # a new stall: asked again
    wait_for(lambda: len(asked) == 2, "a new verdict to be asked", timeout=5, poll=0.05)



def test_a_standing_verdict_is_placed_again_and_the_newer_answer_is_said():
    """A stall named while the ranks still imported torch (read then, they wait in the import machinery)
    is placed again every stall timeout while it stands: status then says where they wait now. One
    question at a time; the last answer stands until the next one comes."""
    import threading

    from launcher.targets.shared.heartbeat import Watch

    answers = iter(["rank 0 waits in join (<frozen posixpath>:82)", "rank 0 waits in all_reduce (c10d.py:9)"])
    release = threading.Event()
    asked: list[float] = []

    def where(verdict: dict, nodes: list[dict]) -> str:
        asked.append(time.monotonic())
        if len(asked) == 2:
            release.wait(5)  # the second question is slow: the first answer is said meanwhile
        return next(answers)

    w = Watch(port=0, nodes=2, host="h", outputs=[], timeout=0.3, action="report", state_path="/nonexistent/w.json",
              on_stall=lambda m: None, where=where)
    w.WHERE_AGAIN_S = 0.1  # read again every stall timeout (0.3 s here), at least this far apart
    verdict = {"kind": "quiet", "node": None, "since": 1.0, "message": "no node has written output"}

    def placed() -> str:
        tick = dict(verdict)
        w._placed(tick)
        return str(tick.get("where", ""))

    wait_for(lambda: "join" in placed(), "the first answer", timeout=5, poll=0.05)
    wait_for(lambda: placed() is not None and len(asked) == 2, "the verdict to be placed again", timeout=5, poll=0.05)
    assert asked[1] - asked[0] >= 0.3
    for _ in range(5):  # asked, not answered yet: the first answer stands and no third question goes out
        assert "join" in placed()
        time.sleep(0.1)
    assert len(asked) == 2
    release.set()
    wait_for(lambda: "all_reduce" in placed(), "the newer answer", timeout=5, poll=0.05)


def _framed(rank: int, n: int, wait: int, at: str | None) -> dict:
    return {"node": rank, "host": f"h{rank}", "vitals": {"t": 100.0, "ranks": [
        {"rank": rank, "local_rank": 0, "pid": 40 + rank, "state": "S", "cpu": 1.0,
         "frames": {"n": n, "wait": wait, "at": at}}]}}


def test_the_rank_the_others_keep_waiting_for_is_the_straggler_whatever_it_does():
    """Issue 44 item 3: a rank sleeping in its data path uses as little CPU as its peers waiting for it,
    so only where the stacks are tells them apart: it waited in none of its samples, they in most."""
    from launcher.targets.shared.straggle import SAMPLES, Straggle

    judge = Straggle()
    nodes = [_framed(0, 8, 7, None), _framed(1, 8, 0, "read_shard (data.py:88)"), _framed(2, 8, 8, None)]
    for i in range(SAMPLES - 1):
        assert judge.judge(nodes, 100.0 + i) == []  # three judgements in a row, as every rule
    (slow,) = judge.judge(nodes, 103.0)
    assert slow["rank"] == 1 and slow["measured"] == "frames" and slow["at"] == "read_shard (data.py:88)"
    assert slow["message"] == ("rank 1 on node 1 (h1) is the one the others wait for: its stack was in read_shard "
                               "(data.py:88) (waiting on its peers in 0% of its last 8 samples, the others in 88% or "
                               "more) (judged by where each rank's Python stack was: py-spy)")
    # Not when another rank waits little too (two of them work: who waits for whom is not told), nor on
    # too few samples, nor in lockstep (all waiting alike).
    for other in ([_framed(0, 8, 3, "x (a.py:1)"), nodes[1], nodes[2]], [_framed(0, 3, 3, None), _framed(1, 3, 0, "y")],
                  [_framed(0, 8, 8, None), _framed(1, 8, 8, None)]):
        fresh = Straggle()
        assert not any(fresh.judge(other, 100.0 + i) for i in range(SAMPLES + 1)), other


def test_the_frame_sampler_keeps_each_ranks_last_places_without_pausing_it(tmp_path, monkeypatch):
    """``FrameSampler``: nothing in its first seconds, then py-spy --nonblocking on every pid at once, each
    sample kept per pid (the last WINDOW), waiting when the main thread is in torch.distributed or autograd, else the program's own
    innermost frame; a pid no longer asked is forgotten; DDPJOB_SAMPLE_STACKS=0 turns it off."""
    c10d = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    dumps = {41: [{"thread_name": "MainThread", "frames": [{"name": "all_reduce", "filename": c10d, "line": 3913,
                                                            "short_filename": "torch/distributed/distributed_c10d.py"},
                                                           {"name": "main", "filename": "/w/t.py", "line": 9}]}],
             42: [{"thread_name": "MainThread", "frames": [{"name": "sleep", "filename": "/usr/lib/python3.11/time.py",
                                                            "line": 1}, {"name": "read_shard", "filename": "/w/data.py",
                                                                         "short_filename": "data.py", "line": 88}]}]}
    asked = tmp_path / "asked"
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(asked)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    f"print(json.dumps({json.dumps({str(k): v for k, v in dumps.items()})}[sys.argv[3]]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(stacks.PY_SPY_ENV, str(fake))
    sampler = stacks.frame_sampler()
    assert isinstance(sampler, stacks.FrameSampler)
    # None in its first FIRST_S: the ranks are importing, and a start is when py-spy costs the most.
    assert sampler([41, 42]) == {} and not asked.exists()
    assert sampler._next - time.monotonic() > stacks.FIRST_S - 1
    sampler.every_s, sampler._next = 0.0, 0.0
    monkeypatch.setattr(stacks, "BUDGET", 1e9)  # the CPU budget never holds a sample back here
    for _ in range(3):
        seen = sampler([41, 42])
    assert seen == {41: {"n": 3, "wait": 3, "at": None}, 42: {"n": 3, "wait": 0, "at": "read_shard (data.py:88)"}}
    assert all("--nonblocking" in line for line in asked.read_text().splitlines())
    assert set(sampler([42])) == {42}
    # The budget: the py-spy processes' CPU (each fake one a Python start, ~20 ms) spread over 1e-6 of the
    # cores puts the next sample far off: asked at once again, nothing new is read.
    monkeypatch.setattr(stacks, "BUDGET", 1e-6)
    sampler._next = 0.0
    sampler([42])
    assert sampler._next - time.monotonic() > 50 and sampler([42])[42]["n"] == 5, sampler._next
    monkeypatch.setenv(stacks.SAMPLE_ENV, "0")
    assert stacks.frame_sampler() is None


@pytest.mark.real
def test_a_rank_held_back_by_sleeping_is_named_the_straggler_with_its_frame(cli, tmp_path):
    """The issue's own case: a plain 2-node gloo script whose rank 1 sleeps 0.4 s more per step in its
    data path (no CPU, no step reports) is named the straggler within 60 s, with the frame it sleeps in."""
    _needs_py_spy()
    (tmp_path / "slowrank.py").write_text(SLOW_RANK)
    stop = tmp_path / "stop"
    job_id = cli("submit", "-q", "--nodes", "2", "--set", f"env.STOP={stop}", "--", "python", "slowrank.py",
                 cwd=tmp_path, check=True).stdout.strip()
    try:
        def named() -> str | None:
            out = cli("status", job_id).stdout
            return out if "straggler: rank 1" in out else None

        status = wait_for(named, "status to name rank 1 the straggler", timeout=60, poll=2.0)
        assert "is the one the others wait for: its stack was in read_shard (slowrank.py:7)" in status, status
        top = cli("top", job_id, "--once", check=True).stdout
        assert re.search(r"\n1 localhost +1 .*STRAGGLER", top), top
    finally:
        stop.touch()
    cli("wait", job_id, "--timeout", "60")
