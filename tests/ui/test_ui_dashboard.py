"""``ddpjob ui`` for real: the server as users start it, a plain HTTP client for its guard, and a
real headless chromium watching a real local job of the reference trainer (two torchrun agents,
gloo), then cancelling it from the page."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path

import pytest
from testkit import wait_for, wait_for_no_job_processes

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-value-for-the-ui-test"
# The quickstart, shrunk and slowed (the trainer's test-only --step-delay) so that it is still
# running while the browser looks (400 s at least; the test cancels it): 8 steps an epoch, a metrics
# line every step.
SLOW_TRAINER = ("command=[python, -m, launcher.train, --dataset, synthetic, --model, mlp, --train-size, '512', "
                "--eval-size, '64', --epochs, '200', --batch-size, '32', --log-every, '1', --step-delay, '0.25']")


def request(dash, method: str, path: str, *, host: str | None = None, token: str | None = "",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """One request over a fresh connection; ``token=""`` sends the dashboard's own, None none."""
    query = "" if token is None else f"{'&' if '?' in path else '?'}token={dash.token if token == '' else token}"
    conn = http.client.HTTPConnection(dash.host, dash.port, timeout=30)
    try:
        conn.putrequest(method, path + query, skip_host=True)
        conn.putheader("Host", host if host is not None else f"{dash.host}:{dash.port}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


@pytest.mark.real
def test_only_requests_with_the_token_and_its_own_host_are_answered(dashboard):
    assert dashboard.host == "127.0.0.1" and re.fullmatch(r"[A-Za-z0-9_-]{32,}", dashboard.token)
    status, headers, body = request(dashboard, "GET", "/")
    assert status == 200 and "<h1>Jobs</h1>" in body and "No jobs yet" in body
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    assert request(dashboard, "GET", "/", host=f"localhost:{dashboard.port}")[0] == 200
    assert request(dashboard, "GET", "/static/app.js")[0] == 200
    wrong = ("y" if dashboard.token[0] == "x" else "x") + dashboard.token[1:]  # one character off
    for path in ("/", "/live/jobs", "/static/app.js", "/jobs/nope"):
        status, _, body = request(dashboard, "GET", path, token=None)
        assert status == 403 and "token" in body, path
        assert request(dashboard, "GET", path, token=wrong)[0] == 403, path
        # DNS rebinding: evil.example resolved to 127.0.0.1 reaches the port, with its own name in Host.
        status, _, body = request(dashboard, "GET", path, host=f"evil.example:{dashboard.port}")
        assert status == 403 and "Host" in body and dashboard.token not in body, path
    assert request(dashboard, "GET", "/", host=f"127.0.0.1:{dashboard.port + 1}")[0] == 403
    assert request(dashboard, "GET", "/", host="")[0] == 403
    # Cancel: POST only, with the token, and not from another site's page.
    assert request(dashboard, "GET", "/jobs/nope/cancel")[0] == 405
    assert request(dashboard, "POST", "/jobs/nope/cancel", token=None)[0] == 403
    assert request(dashboard, "POST", "/jobs/nope/cancel", headers={"Origin": "http://evil.example"})[0] == 403
    status, _, body = request(dashboard, "POST", "/jobs/nope/cancel",
                              headers={"Origin": f"http://127.0.0.1:{dashboard.port}"})
    assert status == 404 and "no job with id" in body
    assert request(dashboard, "GET", "/jobs/nope")[0] == 404
    assert request(dashboard, "GET", "/no/such/page")[0] == 404


def step_of(text: str | None) -> int | None:
    found = re.search(r"step (\d+)", text or "")
    return int(found.group(1)) if found else None


# The live parts are replaced every 2 s: read them in the page, in one go, rather than through element
# handles that go stale between finding and reading.
def text(browser, css: str) -> str | None:
    return browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : null", css)


def texts(browser, css: str) -> list[str]:
    return browser.execute_script("return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)", css)


def attribute(browser, css: str, name: str) -> str | None:
    return browser.execute_script("const e = document.querySelector(arguments[0]); "
                                  "return e ? e.getAttribute(arguments[1]) : null", css, name)


def page_errors(browser) -> list[str]:
    """What the browser's console reported as errors: a script or style the page's policy blocked,
    a request refused (403), a script error."""
    return [e["message"] for e in browser.get_log("browser") if e.get("level") == "SEVERE"]


def full_page_shot(browser, path: Path) -> None:
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(max(int(height) + 40, 900), 6000))
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)


@pytest.mark.real
def test_browser_follows_a_running_job_and_cancels_it(cli, dashboard, browser, shots_dir, ddpjob_home):
    from selenium.webdriver.common.by import By

    proc = cli("submit", "-q", str(REPO / "jobs" / "quickstart.yaml"), "--nodes", "2", "--set", SLOW_TRAINER,
               "--set", f"env.WANDB_API_KEY={SECRET}")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()

    # The jobs table: the job's row, its progress moving on while the page stays (no reload).
    browser.get(dashboard.url)
    row = f'tr[data-job="{job_id}"]'
    first = wait_for(lambda: step_of(text(browser, f"{row} td.progress")), "the jobs table to show the job's first steps",
                     timeout=180)
    later = wait_for(lambda: (s := step_of(text(browser, f"{row} td.progress"))) is not None and s > first and s,
                     "the progress to move on")
    assert later > first
    assert text(browser, f"{row} .state") == "RUNNING" and text(browser, f"{row} td:nth-child(3)") == "local"
    assert re.fullmatch(r"\d+[smhd]", text(browser, f"{row} td.age") or "")
    browser.save_screenshot(str(shots_dir / "jobs.png"))
    assert page_errors(browser) == []

    # The job page: curves (one line per run, at least two points), nodes and ranks, each node's log.
    browser.find_element(By.CSS_SELECTOR, f"{row} a").click()
    loss = 'svg.chart[aria-label="loss by step"] polyline.run'
    points = wait_for(lambda: len((attribute(browser, loss, "points") or "").split()) >= 2 and
                      attribute(browser, loss, "points"), "the loss curve on the job page")
    assert len(points.split()) >= 2
    log0 = 'pre.log[data-node="0"]'
    wait_for(lambda: re.search(r"\[node0 rank0\] epoch \d+ step \d+/\d+ loss", text(browser, log0) or ""),
             "node 0's log tail with steps")
    before = (text(browser, log0) or "").splitlines()[-1]
    wait_for(lambda: (text(browser, log0) or "").splitlines()[-1:] != [before], "node 0's log tail to move on (live)")
    nodes = texts(browser, "table.nodes tbody tr")
    assert len(nodes) == 2 and nodes[0].split()[:2] == ["0", "0"] and nodes[1].split()[:2] == ["1", "1"], nodes
    assert "rank1" in (text(browser, 'pre.log[data-node="1"]') or "")
    spec = text(browser, "pre.spec") or ""
    assert "WANDB_API_KEY: '***'" in spec and "--step-delay" in spec
    assert SECRET not in browser.page_source
    full_page_shot(browser, shots_dir / "job.png")
    assert page_errors(browser) == []

    # Cancel from the page (it asks first): the job ends CANCELLED and its processes stop.
    browser.execute_script("document.querySelector('button.cancel').click()")
    alert = wait_for(lambda: _alert(browser), "the confirmation question")
    assert job_id in alert.text
    alert.accept()
    wait_for(lambda: text(browser, "dl.facts .state") == "CANCELLED", "the page to show CANCELLED", timeout=60)
    assert text(browser, "button.cancel") is None
    status = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
    assert status["state"] == "CANCELLED"
    wait_for_no_job_processes(ddpjob_home, "the cancel from the dashboard")
    full_page_shot(browser, shots_dir / "job-cancelled.png")


def _alert(browser):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return browser.switch_to.alert
    except NoAlertPresentException:
        return None
