"""Dates and causes that are true (issue 47, item 5): a job's end and duration come from its target's own
record of it (the local supervisor's ``state.json``, sacct's Start and End, the Kubernetes object's times),
not from when ddpjob first looked, so ``list``, ``status`` and ``results`` agree however late they are
asked; and a node that failed on a full disk says so. Pure but for one real local job."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from launcher.core.states import JobState
from launcher.service.registry import Registry
from launcher.targets.jobstatus import JobStatus, TaskStatus
from launcher.targets.k8s.status import times
from launcher.targets.local.payload import LocalHandle
from launcher.targets.shared import rootcause
from launcher.targets.shared.rootcause import NodeFailure, first_and_after, node_failure
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm.payload import SlurmHandle
from launcher.targets.slurm.query import parse_sacct, parse_scontrol, parse_squeue
from launcher.targets.slurm.status import job_status as slurm_status


def _durations(cli, job_id: str) -> tuple[dict, float, float, str, str]:
    """(list's record, status's duration_s, results' first run's, the list row, status's text) of ``job_id``."""
    (listed,) = [j for j in json.loads(cli("list", "-o", "json", check=True).stdout) if j["id"] == job_id]
    shown = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
    results = json.loads(cli("results", job_id, "-o", "json", check=True).stdout)
    runs = results["runs"] if isinstance(results, dict) else results[0]["runs"]
    row = next(line for line in cli("list", check=True).stdout.splitlines() if line.startswith(job_id))
    text = cli("status", job_id, check=True).stdout
    return listed, shown["duration_s"], runs[0]["duration_s"], row, text


def test_a_local_job_asked_a_minute_after_it_ended_lists_its_own_duration(cli, ddpjob_home):
    """A 7 s run that ended a minute ago, first seen now: 7 s in list, status and results, not 1m07s."""
    registry = Registry(ddpjob_home)
    job_id, _ = registry.reserve("late", "local", {"name": "late", "nodes": 1})
    run_dir = str(registry.runs_dir() / job_id)
    registry.record_handle(job_id, LocalHandle(job_id, run_dir, pid=0).to_json())  # its supervisor is gone
    start = time.time() - 67.0
    with sqlite3.connect(registry.path) as db:  # submitted just before it started
        db.execute("UPDATE jobs SET created_at = ? WHERE id = ?", (start - 0.4, job_id))
    run = {"index": 0, "params": {}, "state": "SUCCEEDED", "message": "", "nodes": [], "started": start,
           "ended": start + 7.0}
    os.makedirs(run_dir)
    RunFolder(run_dir).write_state({"state": "SUCCEEDED", "message": "", "started": start - 0.1,
                                    "ended": start + 7.2, "elements": [run]})
    listed, shown, result, row, text = _durations(cli, job_id)
    assert listed["duration_s"] == round(shown, 1) == round(result, 1) == 7.0, (listed, shown, result)
    assert row.split()[5] == "7s" and "duration: 7.0s" in text, (row, text)
    rec = registry.get(job_id)
    assert (rec.started_at, rec.ended_at) == (start, start + 7.0)  # the run's, as results tells them


def test_a_job_whose_target_does_not_say_when_it_ended_is_dated_when_seen():
    """The fallback: no time from the target, the end is when ddpjob first saw it ended (and kept)."""
    before = time.time()
    registry = Registry()
    job_id, _ = registry.reserve("quiet", "local", {"name": "quiet"})
    rec = registry.note_state(registry.get(job_id), JobState.FAILED, "gone", started=None, ended=None)
    assert rec.started_at is None and before <= (rec.ended_at or 0) <= time.time()
    again = registry.note_state(rec, JobState.FAILED, "gone", ended=1.0)  # terminal: never moved again
    assert again.ended_at == rec.ended_at


def test_a_jobs_span_is_its_first_runs_start_to_its_last_runs_end():
    runs = [TaskStatus(0, JobState.SUCCEEDED, started=10.0, ended=17.0),
            TaskStatus(1, JobState.FAILED, started=18.0, ended=20.5),
            TaskStatus(2, JobState.CANCELLED, message="not run")]  # never started: no say in it
    assert JobStatus(JobState.FAILED, tasks=runs, started=9.0, ended=30.0).span() == (10.0, 20.5)
    assert JobStatus(JobState.RUNNING, tasks=runs[:1]).span() == (10.0, None)  # no end while it runs
    lost = [runs[0], TaskStatus(1, JobState.FAILED, started=18.0)]  # a run whose end is not known
    assert JobStatus(JobState.FAILED, tasks=lost, ended=25.0).span() == (10.0, 25.0)  # the job's own, then
    assert JobStatus(JobState.FAILED, tasks=lost).span() == (10.0, None)  # ... or when ddpjob saw it
    assert JobStatus(JobState.CANCELLED, tasks=runs[2:], started=3.0, ended=4.0).span() == (3.0, 4.0)


def _local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def test_slurm_records_carry_sacct_start_and_end_and_the_runs_take_them(tmp_path):
    sacct = ("40|COMPLETED|0:0|n1|None|2026-11-28T10:00:00|2026-11-28T10:00:07\n"
             "41|RUNNING|0:0|n1|None|2026-11-28T10:01:00|Unknown\n"
             "42|PENDING|0:0|None assigned|Priority|2026-11-28T11:00:00|Unknown\n"  # Slurm's guess, not a start
             "43|FAILED|1:0|n1|None\n")  # an older answer without the two columns
    recs = parse_sacct(sacct)
    assert (recs["40"].started, recs["40"].ended) == (_local("2026-11-28T10:00:00"), _local("2026-11-28T10:00:07"))
    assert (recs["41"].started, recs["41"].ended) == (_local("2026-11-28T10:01:00"), None)  # an end only once ended
    assert (recs["42"].started, recs["42"].ended) == (None, None)
    assert (recs["43"].started, recs["43"].ended, recs["43"].state) == (None, None, "FAILED")
    squeue = parse_squeue("44|COMPLETED|n1|None|2026-11-28T10:00:00|2026-11-28T10:00:09\n45|RUNNING|n1|None\n")
    assert squeue["44"].ended == _local("2026-11-28T10:00:09") and squeue["45"].started is None
    scontrol = parse_scontrol("JobId=46 JobState=RUNNING StartTime=2026-11-28T10:00:00 EndTime=2026-11-29T10:00:00\n")
    assert scontrol["46"].started == _local("2026-11-28T10:00:00") and scontrol["46"].ended is None  # its time limit
    handle = SlurmHandle("j", str(tmp_path), slurm_job_id="40", job_dir=str(tmp_path))
    assert slurm_status(handle, recs).span() == (_local("2026-11-28T10:00:00"), _local("2026-11-28T10:00:07"))


def test_kubernetes_runs_take_their_objects_start_and_completion_times():
    pytorchjob = {"startTime": "2026-11-28T10:00:00Z", "completionTime": "2026-11-28T10:00:07Z",
                  "conditions": [{"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-11-28T10:00:08Z"}]}
    ten = 1795860000.0  # 2026-11-28T10:00:00Z
    assert times(pytorchjob, JobState.SUCCEEDED) == (ten, ten + 7)
    assert times(pytorchjob, JobState.RUNNING) == (ten, None)
    trainjob = {"conditions": [{"type": "Created", "status": "True", "lastTransitionTime": "2026-11-28T09:59:00Z"},
                               {"type": "Failed", "status": "True", "lastTransitionTime": "2026-11-28T10:00:05Z"}]}
    assert times(trainjob, JobState.FAILED) == (None, ten + 5)  # the condition that says it ended
    assert times(None, JobState.FAILED) == (None, None)


def _full(monkeypatch: pytest.MonkeyPatch, free_blocks: int, free_files: int = 1000) -> None:
    """The disk under every path: 4 KiB blocks, ``free_blocks`` of them and ``free_files`` inodes left."""
    full = os.statvfs_result((4096, 4096, 1 << 20, free_blocks, free_blocks, 1 << 16, free_files, free_files, 0, 255))
    monkeypatch.setattr(rootcause.os, "statvfs", lambda path: full)


def _silent_node(tmp_path: Path) -> NodeFailure:
    """A node whose log is empty: its program, torchrun and ddpjob could not write a word."""
    (tmp_path / "node-0.log").write_text("")
    return NodeFailure(0, str(tmp_path / "node-0.log"), str(tmp_path / "error.json"), str(tmp_path / "torchrun"))


def test_a_node_that_failed_silently_on_a_full_disk_names_the_disk(tmp_path, monkeypatch):
    node = _silent_node(tmp_path)
    _full(monkeypatch, free_blocks=3)
    first, cause = first_and_after([node], procs_per_node=1)  # what the supervisor records
    assert first == 0 and cause.startswith("node 0 failed: the disk is full (")
    assert "12 KiB free" in cause and "ddpjob prune" in cause, cause
    _full(monkeypatch, free_blocks=1 << 10, free_files=0)
    assert "no free file entries (inodes)" in node_failure(node=0, procs_per_node=1, log=node.log,
                                                           error_file=node.error_file, torchrun_log_dir="")


def test_a_node_with_words_of_its_own_or_room_on_its_disk_is_told_as_before(tmp_path, monkeypatch):
    node = _silent_node(tmp_path)
    _full(monkeypatch, free_blocks=1 << 20)
    assert first_and_after([node], procs_per_node=1) == (0, "node 0 failed")  # room left: nothing to blame
    _full(monkeypatch, free_blocks=0)
    summary = ["[default0]:Traceback (most recent call last):", "[default0]:ValueError: bad lr",
               "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : 1"]
    Path(node.log).write_text("\n".join(summary) + "\n")
    _, cause = first_and_after([node], procs_per_node=1)  # the rank's own words were written: they tell it
    assert cause.startswith("rank 0 exited with code 1: ") and cause.endswith("ValueError: bad lr") and "disk" not in cause


@pytest.mark.real
def test_list_status_and_results_agree_on_a_real_local_jobs_duration_asked_late(cli, tmp_path):
    job_id = cli("submit", "-q", "--name", "short", "--", "python", "-c", "import time; time.sleep(1)",
                 cwd=tmp_path, check=True).stdout.strip()
    state = RunFolder(str(Path(os.environ["DDPJOB_HOME"]) / "runs" / job_id))
    for _ in range(600):  # ended, as its supervisor says, without asking ddpjob (which would date it now)
        if (state.read_state() or {}).get("ended"):
            break
        time.sleep(0.2)
    time.sleep(4.0)
    listed, shown, result, row, text = _durations(cli, job_id)
    assert result is not None and result >= 1.0, result
    assert abs(listed["duration_s"] - result) < 0.1 and abs(shown - result) < 0.01, (listed, shown, result)
    assert listed["age_s"] - listed["duration_s"] >= 3.8, listed  # the wait after its end is no part of it
    assert row.split()[2] == "SUCCEEDED" and f"duration: {result:.1f}s" in text, (row, text)


# torchrun's summary as it prints it (torch.distributed.elastic's failure template) when two workers of
# one node failed within the same second and it broke the tie by local rank: rank 0 died in gloo because
# rank 1 raised and left; the node's own error is rank 1's.
TIED = """\
[default1]:Traceback (most recent call last):
[default1]:  File "/work/raiser.py", line 7, in <module>
[default1]:    raise ValueError("bad batch on rank 1")
[default1]:ValueError: bad batch on rank 1
[default0]:Traceback (most recent call last):
[default0]:  File "/work/raiser.py", line 8, in <module>
[default0]:    dist.barrier()
[default0]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:50862
E1129 03:01:02.123000 71 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 80) of binary: python
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
raiser.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_03:01:02
  host      : n1
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 81)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_03:01:02
  host      : n1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 80)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_rank_that_raised_is_the_cause_before_one_that_torchrun_named_first_for_a_peer_gone(tmp_path):
    """torchrun names local rank 0 (its gloo error) first on a tie; the node's cause is rank 1's
    ValueError, and it stands before a node whose ranks only lost their peers, whatever the end times
    (a Slurm+podman run where node 0's runner ended 7 s after node 1's named the victim)."""
    assert rootcause.torchrun_failures(TIED.splitlines()) == [(0, 1), (1, 3)]
    log = tmp_path / "node-0.log"
    log.write_text(TIED)
    none = str(tmp_path / "none.json")
    cause = node_failure(node=0, procs_per_node=2, log=str(log), error_file=none, torchrun_log_dir=str(tmp_path / "no"))
    assert cause.startswith("rank 1 exited with code 3: ") and cause.endswith("ValueError: bad batch on rank 1"), cause
    victim = tmp_path / "node-1.log"
    victim.write_text(TIED.replace("rank 1", "rank 3").replace("ValueError: bad batch on rank 3", "RuntimeError: Connection closed by peer")
                      .replace("rank      : 0 (", "rank      : 2 (").replace("rank      : 1 (", "rank      : 3 ("))
    now = time.time()
    failures = [NodeFailure(0, str(log), none, str(tmp_path / "no"), now + 7), NodeFailure(1, str(victim), none, str(tmp_path / "no"), now)]
    node, said = first_and_after(failures, 2)
    assert node == 0 and said.startswith(cause), said
    # A summary that names only its root cause (no other failures) reads as before.
    alone = TIED[:TIED.index("[1]:")] + "  <NO_OTHER_FAILURES>\n" + TIED[TIED.index("-" * 60 + "\nRoot"):]
    assert rootcause.torchrun_failures(alone.splitlines()) == [(0, 1)]
