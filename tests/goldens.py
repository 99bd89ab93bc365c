"""Golden-file comparison shared by the render tests. ``DDPJOB_UPDATE_GOLDEN=1`` rewrites the files."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest


def assert_golden(path: Path, text: str) -> None:
    """``text`` must equal the file at ``path`` (whole text; a unified diff on mismatch)."""
    if os.environ.get("DDPJOB_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with DDPJOB_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"rendered text differs from {path}:\n{diff}")
