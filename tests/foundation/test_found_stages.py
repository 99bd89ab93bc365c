"""Issue 25 item 1: while a job starts, a terminal shows where it is (nodes starting, rendezvous,
workers running, then its progress) with the elapsed time; piped output gets nothing extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.targets.shared.stage import startup_stage


def test_the_stage_follows_the_files_the_nodes_write(tmp_path: Path):
    # Issue 36 item 1: nodes started, ranks assigned (rendezvous done), first step: each line says
    # one of them, and none says every node is up while it waits for them to join.
    nodes = [(str(tmp_path / f"node-{n}.log"), str(tmp_path / f"torchrun-node-{n}")) for n in range(2)]
    assert startup_stage([nodes]) == "starting 2 node(s)"
    Path(nodes[0][0]).write_text("")
    assert startup_stage([nodes]) == "1/2 node(s) started; the rendezvous waits for the other 1"
    Path(nodes[1][0]).write_text("")
    assert startup_stage([nodes]) == "2/2 node(s) started; their torchrun agents are meeting at the rendezvous"
    (Path(nodes[0][1]) / "none_abc" / "attempt_0").mkdir(parents=True)
    assert startup_stage([nodes]) == "rendezvous done, ranks assigned; workers starting on 1/2 node(s)"
    (Path(nodes[1][1]) / "none_def" / "attempt_0").mkdir(parents=True)
    assert startup_stage([nodes]) == "workers running on 2/2 node(s); waiting for the first step"
    later = [(str(tmp_path / "t1-node-0.log"), str(tmp_path / "t1-torchrun"))]
    assert startup_stage([nodes, later]).startswith("task 0: workers running")  # the latest run that started
    Path(later[0][0]).write_text("")
    assert startup_stage([nodes, later]) == "task 1: 1/1 node(s) started; their torchrun agents are meeting at the rendezvous"
    assert startup_stage([]) is None


SLOW = "import os, time\ntime.sleep(3)\nprint('rank', os.environ['RANK'], 'hello', flush=True)\n"


def on_a_terminal(args: list[str], cwd: Path) -> str:
    """The real command line with stdout and stderr on a pseudo-terminal (colours off: NO_COLOR); all it wrote."""
    main, sub = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=sub, stderr=sub, env={**os.environ, "TERM": "xterm", "NO_COLOR": "1"})
    os.close(sub)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the other side closed: the command has exited
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=120)
    os.close(main)
    return out.decode("utf-8", "replace")


@pytest.mark.real
def test_submit_follow_shows_the_stages_on_a_terminal_and_nothing_extra_when_piped(cli, tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    shown = on_a_terminal(["submit", "--nodes", "2", "-f", "--", "python", "slow.py"], tmp_path)
    stages = [part.split("\r")[0] for part in shown.split("\x1b[K") if part.startswith("[ddpjob] ")]
    # the earlier stages may pass between two looks on a loaded machine: the pure test walks them all
    assert any("workers running on 2/2 node(s)" in s for s in stages), shown
    assert all(s.split(":")[0].removeprefix("[ddpjob] ").rstrip("s").isdigit() for s in stages), stages  # elapsed
    assert "[node0 rank0] rank 0 hello" in shown and "SUCCEEDED" in shown
    piped = cli("submit", "--nodes", "2", "-f", "--", "python", "slow.py", cwd=tmp_path)
    assert piped.returncode == 0 and "[ddpjob]" not in piped.stdout + piped.stderr and "\x1b" not in piped.stderr


@pytest.mark.real
def test_wait_shows_the_stage_before_the_first_step(cli, tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    job_id = cli("submit", "-q", "--nodes", "2", "--", "python", "slow.py", cwd=tmp_path, check=True).stdout.strip()
    shown = on_a_terminal(["wait", job_id], tmp_path)
    assert f"{job_id}: RUNNING: " in shown and f"{job_id}: SUCCEEDED" in shown, shown
