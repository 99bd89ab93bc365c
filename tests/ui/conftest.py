"""The dashboard (``ddpjob ui``) as users run it, and a real headless browser to look at it.

``dashboard`` starts ``ddpjob ui --port 0`` on this test's registry and yields where it listens and
its token; it is stopped afterwards with SIGTERM (uvicorn shuts down as on Ctrl-C). ``browser`` is Debian's chromium, headless,
driven by selenium through Debian's chromedriver (``apt-get install chromium chromium-driver``;
.ci/run installs them). Nothing is downloaded: selenium is given both programs, so its driver
manager never runs. Without them the browser tests skip with that reason; under CI=true they fail.

Screenshots go to ``$DDPJOB_UI_SHOTS`` when set, else to ``ui-screenshots/`` in pytest's base
temporary folder (``/tmp/pytest-of-$USER/pytest-current/ui-screenshots`` after a run: pytest keeps
the last three runs' folders).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
BROWSER_HINT = "apt-get install chromium chromium-driver (Debian's packages; .ci/run installs them)"


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the dashboard's browser tests cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass
class Dashboard:
    url: str  # as printed: http://127.0.0.1:PORT/?token=...
    base: str  # http://127.0.0.1:PORT
    host: str
    port: int
    token: str
    proc: subprocess.Popen[str]


@pytest.fixture
def dashboard(ddpjob_home: Path) -> Iterator[Dashboard]:
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "ui", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or []], daemon=True).start()
    try:
        first = lines.get(timeout=60)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"ddpjob ui printed no URL within 60 s: {proc.communicate()[1]}") from None
    assert first.startswith("ddpjob dashboard: http://"), first
    url = first.split(": ", 1)[1].strip()
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    token = parts.query.removeprefix("token=")
    yield Dashboard(url, f"{parts.scheme}://{parts.netloc}", parts.hostname, parts.port, token, proc)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("ddpjob ui did not stop on SIGTERM within 20 s") from None


SHOTS = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def shots_dir(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    where = os.environ.get("DDPJOB_UI_SHOTS")
    path = Path(where) if where else tmp_path_factory.getbasetemp() / "ui-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    pytestconfig.stash[SHOTS] = path
    return path


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say where the screenshots are (pytest's temporary folders are many and pruned)."""
    if SHOTS in config.stash:
        terminalreporter.write_line(f"dashboard screenshots: {config.stash[SHOTS]}")


@pytest.fixture(scope="session")
def browser_programs() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        _skip_or_fail(f"no {'chromium' if not chromium else 'chromedriver'} here: {BROWSER_HINT}")
    try:
        import selenium  # noqa: F401
    except ImportError:
        _skip_or_fail("selenium is not installed: pip install -c constraints.txt -e '.[dev]'")
    assert chromium and driver
    return chromium, driver


@pytest.fixture
def browser(browser_programs: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_programs
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium's driver manager: never download anything
    drv = webdriver.Chrome(service=Service(driver, log_output=str(tmp_path / "chromedriver.log")), options=options)
    try:
        yield drv
    finally:
        drv.quit()
