"""Golden-file comparison shared by the render tests. ``DDPJOB_UPDATE_GOLDEN=1`` rewrites the files."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest

# The k8s pod runner's code is shown by size and digest (launcher.targets.k8s.objects.runner.shown): masked, so
# that the goldens do not change with every edit of heartbeat.py (test_k8s_runner checks the real values).
POD_RUNNER = re.compile(r"<pod runner: \d+ characters, sha256 [0-9a-f]{12};")


def assert_golden(path: Path, text: str) -> None:
    """``text`` must equal the file at ``path`` (whole text; a unified diff on mismatch), the k8s pod
    runner's size and digest masked."""
    text = POD_RUNNER.sub("<pod runner: N characters, sha256 DIGEST;", text)
    if os.environ.get("DDPJOB_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with DDPJOB_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"rendered text differs from {path}:\n{diff}")
