"""Issue 33 item 10 (small things users saw): ``logs -f`` exits like ``wait`` for a job that did
not succeed; ``rerun`` takes ``--env-file`` and ``--env`` like ``submit``. Real local jobs through
the real command line in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.real
def test_logs_follow_exits_1_for_a_failed_or_cancelled_job_as_wait_does(cli, tmp_path):
    failed = cli("submit", "-q", "--", "python", "-c", "import sys; print('bye'); sys.exit(3)", cwd=tmp_path,
                 check=True).stdout.strip()
    followed = cli("logs", failed, "-f", timeout=120)
    assert followed.returncode == 1 and "bye" in followed.stdout and f"{failed}: FAILED" in followed.stderr, followed
    assert cli("wait", failed).returncode == 1

    sleeper = cli("submit", "-q", "--", "python", "-c", "import time; print('up', flush=True); time.sleep(300)",
                  cwd=tmp_path, check=True).stdout.strip()
    follower = subprocess.Popen([sys.executable, "-m", "launcher", "logs", sleeper, "-f"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "up" in cli("logs", sleeper).stdout, "the job's first line", timeout=60)
    assert cli("cancel", sleeper).returncode == 0
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 1 and f"{sleeper}: CANCELLED" in err, (out, err)


@pytest.mark.real
def test_rerun_takes_env_file_and_env_like_submit(cli, tmp_path, ddpjob_home):
    (tmp_path / "show.py").write_text("import os; print('token=' + os.environ['API_TOKEN'], 'seed=' + os.environ['SEED'])\n")
    first = cli("submit", "-q", "--env", "API_TOKEN=typed-value", "--env", "SEED=1", "--", "python", "show.py",
                cwd=tmp_path, check=True).stdout.strip()
    assert cli("wait", first, "--timeout", "120").returncode == 0
    asked = cli("rerun", first, cwd=tmp_path)  # the secret was typed, so it is not stored: asked for
    assert asked.returncode == 2 and "--env-file FILE" in asked.stderr, asked.stderr
    (tmp_path / "run.env").write_text("API_TOKEN=from-the-file\nSEED=2\n")
    again = cli("rerun", first, "-q", "--env-file", "run.env", "--env", "SEED=3", cwd=tmp_path, check=True).stdout.strip()
    assert cli("wait", again, "--timeout", "120").returncode == 0
    assert cli("logs", again, check=True).stdout.strip() == "[node0 rank0] token=from-the-file seed=3"
    status = json.loads(cli("status", again, "-o", "json", check=True).stdout)
    assert status["spec"]["env"] == {"API_TOKEN": "***", "SEED": "3"} and status["rerun_of"] == first
    assert cli("rerun", first, "--env-file", "missing.env", cwd=tmp_path).returncode == 2
