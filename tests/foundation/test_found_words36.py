"""Issue 36 item 7: words and modes a second week of use tripped on. Pure: no job is started."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from launcher.core.states import JobState


def test_status_of_a_running_node_leaves_out_what_is_not_known_yet():
    from launcher.cli.show import status_lines
    from launcher.service.registry import JobRecord
    from launcher.targets.jobstatus import JobStatus, NodeStatus, TaskStatus

    rec = JobRecord("j-abcde", "j", "local", JobState.RUNNING, {}, None, "/tmp/run", None, "", 1.0, 1.0, None)
    node = {"node": 0, "pid": 41, "exit_code": None, "host": "h0", "log": "/tmp/run/node-0.log"}
    shown = "\n".join(status_lines(rec, JobStatus(JobState.RUNNING, "", [TaskStatus(0, JobState.RUNNING, "", [NodeStatus.of(node)])])))
    assert "node 0: pid=41 host=h0" in shown and "None" not in shown, shown
    node["exit_code"] = 0  # a known exit code is shown
    assert "exit_code=0" in "\n".join(status_lines(rec, JobStatus(JobState.RUNNING, "", [TaskStatus(0, JobState.RUNNING, "", [NodeStatus.of(node)])])))


def test_cancel_asks_about_one_job_in_the_singular(monkeypatch, capsys):
    from launcher.cli import queue

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    asked: list[str] = []
    monkeypatch.setattr(queue.click, "confirm", lambda text, default=False: asked.append(text) or False)
    with pytest.raises(SystemExit):
        queue._confirm(["j-abcde  (local, RUNNING)"])
    out = capsys.readouterr().out
    assert "This job will be cancelled:" in out and "1 jobs" not in out and asked == ["Cancel it?"], (out, asked)
    with pytest.raises(SystemExit):
        queue._confirm(["a", "b"])
    assert "These 2 jobs will be cancelled:" in capsys.readouterr().out and asked[-1] == "Cancel them?"
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    from launcher.core.errors import UsageError

    with pytest.raises(UsageError, match=r"this would cancel 1 job;"):
        queue._confirm(["a"])


TRACEBACK_311 = """Traceback (most recent call last):
  File "/w/train.py", line 9, in <module>
    total = values["loss"] / count
            ~~~~~~~~~~~~~~~^~~~~~~
  File "/w/train.py", line 4, in step
    raise ValueError("bad batch")
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: bad batch
"""


def test_root_causes_leave_out_the_traceback_marker_lines(tmp_path: Path):
    from launcher.targets.shared.rootcause import node_failure

    err = tmp_path / "torchrun" / "none_x" / "attempt_0" / "0" / "stderr.log"
    err.parent.mkdir(parents=True)
    err.write_text(TRACEBACK_311)
    log = tmp_path / "node-0.log"
    log.write_text("Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 0)\n  exitcode  : 1\n")
    cause = node_failure(node=1, procs_per_node=1, log=str(log), error_file=str(tmp_path / "none.json"),
                         torchrun_log_dir=str(tmp_path / "torchrun"))
    assert cause == ('rank 1 exited with code 1: File "/w/train.py", line 4, in step | raise ValueError("bad batch") | '
                     "ValueError: bad batch"), cause
    err.unlink()  # no stderr file: the worker's lines in the node log
    log.write_text("".join(f"[default0]:{ln}\n" for ln in TRACEBACK_311.splitlines()) + log.read_text())
    cause = node_failure(node=1, procs_per_node=1, log=str(log), error_file=str(tmp_path / "none.json"),
                         torchrun_log_dir=str(tmp_path / "torchrun"))
    assert "^^^" not in cause and "~~~" not in cause and cause.endswith("ValueError: bad batch"), cause


def test_a_plot_is_readable_as_the_users_own_files_are(tmp_path: Path, monkeypatch):
    pytest.importorskip("matplotlib")
    from launcher.cli.figure import draw
    from launcher.core import home

    old = os.umask(0o022)
    try:
        home.private_files()  # what ddpjob's main does: 077 from now on, the user's 022 kept
        draw([("run 0", [(1, 2.0), (2, 1.0)])], "loss", "j: loss", str(tmp_path / "loss.svg"))
    finally:
        os.umask(old)
        monkeypatch.setattr(home, "_USER_UMASK", [])
    assert stat.S_IMODE((tmp_path / "loss.svg").stat().st_mode) == 0o644


def test_a_user_config_with_only_notify_when_is_a_default_not_a_refusal(tmp_path: Path, monkeypatch):
    from launcher.core.errors import SpecError
    from launcher.spec.defaults import layers, notify_values
    from launcher.spec.load import load_spec

    config = tmp_path / "config.yaml"
    config.write_text("notify:\n  when: [failed]\n")
    monkeypatch.setenv("DDPJOB_CONFIG", str(config))
    monkeypatch.chdir(tmp_path)
    base = {"name": "j", "command": ["python", "t.py"]}
    assert load_spec(None, base=base, defaults=layers()).spec.notify is None  # nothing to do, nothing asked
    told = load_spec(None, base=base, defaults=layers(), values=notify_values("echo done", None)).spec.notify
    assert told is not None and told.command == ["echo", "done"] and told.when == ["failed"]
    with pytest.raises(SpecError, match=r"give notify\.command, notify\.url or both"):  # asked in the spec itself
        load_spec(None, base={**base, "notify": {"when": ["failed"]}}, defaults=layers())


def test_logs_hide_torchs_unnamed_client_warning_but_verbose_and_the_file_keep_it(tmp_path: Path):
    from launcher.targets.shared.logtail import LogSource, follow_files

    noise = "[W1127 02:15:04.123456789 socket.cpp:752] [c10d] The hostname of the client socket cannot be retrieved. err=-3"
    log = tmp_path / "node-0.log"
    log.write_text(f"{noise}\n[default0]:{noise}\n[default0]:step 1\n")
    src = [LogSource(str(log), "node0", 0, 1)]
    assert list(follow_files(src, tail=None, rank=None, follow=False, finished=lambda: True)) == ["[node0 rank0] step 1"]
    assert len(list(follow_files(src, tail=None, rank=None, follow=False, finished=lambda: True, verbose=True))) == 3
    assert log.read_text().count("err=-3") == 2
