"""The dashboard's compare view and the jobs page's filter in a real headless chromium (issue 36): two
real local jobs of a small program (one of them a sweep of two runs) ticked on the jobs page, their runs
side by side with their curves overlaid; and the fixes of item 6 on the pages as a browser lays them out:
ids that never wrap mid-name, an em dash in empty cells, the legend beside the first charts, log lines
that wrap, a node's whole log one click away. The screenshot of the compare view is the README's
(docs/dashboard-compare.png: copy it from the shots folder when the page changes)."""

from __future__ import annotations

import pytest
import yaml
from test_ui_dashboard import attribute, full_page_shot, page_errors, text, texts
from testkit import wait_for

# Any program that appends metrics lines (no torch: seconds). A run with lr below 1 also evaluates, so
# the sweep's other run has an empty eval_loss cell. Rank 0 prints a line far wider than a log pane.
SCRIPT = '''
import json, os, sys, time
lr = float(sys.argv[1])
if os.environ["RANK"] == "0":
    print("first line of the log")
    print("wide:" + "0123456789" * 60)
    with open(os.environ["DDPJOB_METRICS_FILE"], "a") as f:
        for step in range(1, 6):
            line = {"step": step, "loss": 1.0 / (step * lr), "time": time.time()}
            if lr < 1:
                line["eval_loss"] = 2.0 / (step * lr)
            f.write(json.dumps(line) + "\\n")
'''
LONG_NAME = "a-long-job-name-that-wraps-when-narrow"


def submit(cli, tmp_path, name: str, spec: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "workdir": str(tmp_path), "nodes": 1, **spec}))
    proc = cli("submit", str(path), "-q", "-f", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[0]


@pytest.mark.real
def test_tick_two_jobs_and_compare_their_runs(cli, dashboard, browser, shots_dir, tmp_path):
    from selenium.webdriver.common.by import By

    (tmp_path / "mine.py").write_text(SCRIPT)
    base = submit(cli, tmp_path, LONG_NAME, {"command": ["python", "mine.py", "0.8"]})
    sweep = submit(cli, tmp_path, "sweep", {"command": ["python", "mine.py", "{lr}"], "env": {"MODE": "fast"},
                                            "sweep": {"lr": [0.5, 2.0]}})

    # The jobs page, narrow: the long id stays on one line (one box), next to its tick box.
    browser.set_window_size(760, 1000)
    browser.get(dashboard.url)
    wait_for(lambda: len(texts(browser, "table.jobs tbody tr")) == 2, "both jobs in the table")
    lines = browser.execute_script("return document.querySelector(arguments[0]).getClientRects().length",
                                   f'tr[data-job="{base}"] td.id a')
    assert lines == 1, f"the id {base} wraps onto {lines} lines"
    browser.set_window_size(1400, 1000)

    # The filter: by name (any part of id or name), by state; the live part keeps the filter.
    browser.find_element(By.CSS_SELECTOR, "form.filter input[name=name]").send_keys("SWEEP")
    browser.find_element(By.CSS_SELECTOR, "form.filter button").click()
    wait_for(lambda: texts(browser, "table.jobs td.id") == [sweep], "the name filter to keep the sweep only")
    assert "live/jobs" in (attribute(browser, "#jobs", "data-live") or "") and "name=SWEEP" in attribute(
        browser, "#jobs", "data-live")
    browser.get(dashboard.url + "&state=FAILED")
    wait_for(lambda: text(browser, "#jobs") == "No job matches the filter.", "the state filter to leave no job")
    browser.get(dashboard.url + "&state=SUCCEEDED&target=local")
    wait_for(lambda: len(texts(browser, "table.jobs td.id")) == 2, "both SUCCEEDED local jobs")

    # Tick both; the ticks outlive the table's live replacement (every 2 s); compare.
    for job in (base, sweep):
        browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{job}"] input[type=checkbox]').click()
    browser.execute_script("document.querySelector('table.jobs').dataset.old = '1'")
    wait_for(lambda: browser.execute_script("return !document.querySelector('table.jobs').dataset.old"),
             "the jobs table's live replacement", timeout=30)
    assert browser.execute_script("return Array.from(document.querySelectorAll('table.jobs input:checked'), "
                                  "b => b.value)") == [sweep, base]
    browser.find_element(By.CSS_SELECTOR, "button.compare").click()
    wait_for(lambda: "Compare 3 task(s) of 2 job(s)" in (text(browser, "h1") or ""), "the compare view")
    heads = texts(browser, "table.compare thead th.facet")
    assert heads == ["command", "env.MODE", "lr"], heads  # what differs; target, nodes... are shared
    assert "target=local" in (text(browser, "p.shared") or "")
    rows = [r.split("\t") for r in texts(browser, "table.compare tbody tr")]
    assert [r[0].strip() for r in rows] == [f"{sweep}/0", f"{sweep}/1", base]  # the table keeps the order given
    assert rows[1][1:5] == ["python mine.py '{lr}'", "fast", "2.0", "0.1 / 0.1"], rows[1]
    assert rows[2][2:4] == ["\u2014", "\u2014"], rows[2]  # a value a run does not have: an em dash
    assert rows[1][5] == "\u2014", rows[1]  # its eval_loss: none, an em dash, not a bare "/"
    lines = 'svg.chart[aria-label="loss by step"] polyline.run'
    assert len(texts(browser, lines)) == 3  # one curve per run, overlaid
    legend = texts(browser, ".chartarea ul.legend li")
    assert legend[1] == f"{sweep}/1: command=python mine.py '{{lr}}' env.MODE=fast lr=2.0", legend
    legend_box, chart_box = (browser.execute_script("return document.querySelector(arguments[0]).getBoundingClientRect()",
                                                    css) for css in (".chartarea ul.legend", "svg.chart"))
    assert 0 <= chart_box["top"] - legend_box["bottom"] < 40  # the legend sits right above the first charts
    full_page_shot(browser, shots_dir / "dashboard-compare.png")
    assert page_errors(browser) == []

    # The sweep's job page: empty cells, the legend, the log pane's long line wrapped, the whole log.
    browser.find_element(By.LINK_TEXT, f"{sweep}/1").click()
    wait_for(lambda: texts(browser, "table.runs tbody tr"), "the job page's runs")
    cells = texts(browser, "table.runs tbody td")
    assert "/" not in [c.strip() for c in cells] and "\u2014" in cells, cells
    legend_box, chart_box = (browser.execute_script("return document.querySelector(arguments[0]).getBoundingClientRect()",
                                                    css) for css in ("#job ul.legend", "#job svg.chart"))
    assert 0 <= chart_box["top"] - legend_box["bottom"] < 40
    log = 'pre.log[data-node="0"]'
    wait_for(lambda: "wide:" in (text(browser, log) or ""), "the long line in node 0's log pane")
    wide = browser.execute_script("const p = document.querySelector(arguments[0]); return [p.scrollWidth, p.clientWidth]", log)
    assert wide[0] <= wide[1], f"the log pane scrolls sideways: {wide}"  # the long line wraps
    browser.find_element(By.CSS_SELECTOR, 'a.whole[data-node="0"]').click()
    whole = wait_for(lambda: text(browser, "body"), "the whole log")
    assert "first line of the log" in whole and "wide:" + "0123456789" * 60 in whole
    assert page_errors(browser) == []
