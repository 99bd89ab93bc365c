"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Shared test helpers (tests/goldens.py) import by name from any test directory.
sys.path.insert(0, str(Path(__file__).parent))

from testkit import REAL_FIXTURES, REAL_MARKERS, stop_leftovers  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before -m "not real" deselects: it must see these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a fixture which starts something real (testkit.REAL_FIXTURES), or carry a marker
    that needs one, are in the real tier, wherever they live."""
    for item in items:
        if REAL_FIXTURES.keys() & set(getattr(item, "fixturenames", ())) or any(
                item.get_closest_marker(m) for m in REAL_MARKERS):
            item.add_marker(pytest.mark.real)


@pytest.fixture(autouse=True)
def ddpjob_home(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own registry, so nothing touches the user's ~/.ddpjob, and reads no
    defaults file. Afterwards, any
    process the test left running (found by this home in its environment: supervisors, torchrun
    agents, workers) is stopped, so a failed test cannot leave sleepers behind. A test of the pure
    tier (not marked real) that started a local job is an error: it belongs to the real tier."""
    home = tmp_path_factory.mktemp("ddpjob-home")
    monkeypatch.setenv("DDPJOB_HOME", str(home))
    # Nor the user's defaults: no ~/.config/ddpjob/config.yaml or .ddpjob.yaml above the test's
    # folder changes what a test submits (tests of those files set DDPJOB_CONFIG themselves).
    monkeypatch.setenv("DDPJOB_CONFIG", "none")
    yield home
    left, survivors = stop_leftovers(home)
    if left:
        warnings.warn(f"stopped processes {left} this test left running"
                      + (f"; {survivors} survived SIGKILL" if survivors else ""), stacklevel=1)
    started = sorted(p.parent.name for p in home.glob("runs/*/supervisor.log"))
    if started and request.node.get_closest_marker("real") is None:
        pytest.fail(f"this test started local job(s) {started} but is not marked real: add "
                    "@pytest.mark.real (the pure tier, pytest -m 'not real', starts no job)", pytrace=False)


@pytest.fixture
def cli():
    """``cli("submit", ...)`` runs the real command line in a subprocess and returns the result."""
    return ddpjob


def ddpjob(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
           timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real ``ddpjob`` command line in a subprocess (what users run)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ddpjob {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc
