"""Issue 34 on the local target: every rank's health. The stall watch runs beside each local node
(launcher.targets.local.watch), a rank stopped with SIGSTOP is named in status and list, stall.action:
fail ends the job naming it with nothing left running; each rank's vitals (CPU, memory, output age)
are kept in watch.json; a rank slowed on purpose is named the straggler. Real torchrun processes
(gloo on CPU), short stall timeouts through the test-only floor (DDPJOB_TEST_STALL_MIN_S)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from testkit import job_pids, wait_for

TICKER = """
import os, time
while True:
    print("tick", os.environ["RANK"], flush=True)
    time.sleep(0.5)
"""
TIMEOUT_S = 6  # stall.timeout of these tests (the spec's floor of 20 s lowered for tests)
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
    cli("cancel", job_id, check=True)


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
