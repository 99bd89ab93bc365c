"""Issue 36 item 5: a local job's root cause names the nodes that failed after the first one, as on
Slurm (``... (then node(s) 0 failed after it)``), instead of stopping them unnamed."""

from __future__ import annotations

import json

import pytest

# Rank 1 fails on its own; rank 0 fails a moment later, because its peer went away (as a rank in
# an all-reduce with a departed peer does), so the first failure is rank 1's whatever the timing.
TWO_FAILURES = """\
import os, pathlib, time
mark = pathlib.Path(os.environ["MARK"])
if os.environ["RANK"] == "1":
    mark.write_text("gone")
    raise ValueError("rank 1's own error")
while not mark.exists():
    time.sleep(0.02)
time.sleep(0.2)
raise ConnectionResetError("Connection reset by peer")
"""


@pytest.mark.real
def test_a_local_root_cause_names_the_nodes_that_failed_after_it(cli, tmp_path):
    (tmp_path / "two.py").write_text(TWO_FAILURES)
    job = cli("submit", "-q", "--nodes", "2", "--env", f"MARK={tmp_path / 'mark'}", "--", "python", "two.py",
              cwd=tmp_path, check=True).stdout.strip()
    assert cli("wait", job, "--timeout", "120").returncode == 1
    message = json.loads(cli("status", job, "-o", "json", check=True).stdout)["message"]
    assert message.startswith("rank 1 exited with code 1:") and "ValueError: rank 1's own error" in message, message
    assert message.endswith("(then node(s) 0 failed after it)"), message
