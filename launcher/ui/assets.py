"""The dashboard's own style sheet and script, served by the dashboard itself (nothing is fetched
from the internet, and the pages' security policy allows nothing else).

The script does two things: every element with ``data-live="URL"`` is replaced every
``data-every`` ms (default 2000) by the HTML that URL returns (the server renders it), until that
HTML holds an element marked ``data-final`` (the job ended), keeping the boxes the user ticked
(the jobs table's compare boxes) ticked across the replacement; and a form with ``data-confirm``
asks before it is sent (cancel).
"""

from __future__ import annotations

SCRIPT = """\
"use strict";
(function () {
  function toEnd(el) {  // a log shows its newest lines
    el.querySelectorAll("pre.log").forEach(function (p) { p.scrollTop = p.scrollHeight; });
  }
  function follow(el) {
    var every = parseInt(el.getAttribute("data-every") || "2000", 10);
    function tick() {
      fetch(el.getAttribute("data-live"), {cache: "no-store", credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var ticked = Array.from(el.querySelectorAll("input[type=checkbox]:checked"), function (b) { return b.value; });
          el.innerHTML = html;
          el.querySelectorAll("input[type=checkbox]").forEach(function (b) {
            if (ticked.indexOf(b.value) >= 0) { b.checked = true; }
          });
          toEnd(el);
          el.removeAttribute("data-stale");
          if (!el.querySelector("[data-final]")) { setTimeout(tick, every); }
        })
        .catch(function () { el.setAttribute("data-stale", "1"); setTimeout(tick, every * 2); });
    }
    toEnd(el);
    if (!el.querySelector("[data-final]")) { setTimeout(tick, every); }
  }
  document.querySelectorAll("[data-live]").forEach(follow);
  document.addEventListener("submit", function (ev) {
    var question = ev.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { ev.preventDefault(); }
  });
})();
"""

STYLE = """\
:root { --fg: #1d2330; --muted: #5c6577; --line: #d9dde5; --bg: #f6f7f9; --accent: #0072b2; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { background: #1d2330; color: #fff; padding: 10px 24px; display: flex; gap: 16px; align-items: baseline; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
header .where { color: #aeb6c6; font-size: 12px; }
main { padding: 16px 24px 40px; max-width: 1400px; }
h1 { font-size: 20px; margin: 4px 0 12px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); width: 100%; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef0f4; font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .03em; color: var(--muted); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
a { color: var(--accent); }
.state { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; background: #e4e7ec; }
.state-RUNNING { background: #d6eaf8; color: #0b4f7c; }
.state-SUCCEEDED { background: #d5f0e3; color: #0b6140; }
.state-FAILED { background: #fadbd8; color: #922b21; }
.state-CANCELLED { background: #fdebd0; color: #8a4b08; }
.state-PENDING, .state-UNKNOWN { background: #e4e7ec; color: #394150; }
progress { width: 120px; height: 10px; vertical-align: middle; margin-right: 8px; }
.muted { color: var(--muted); }
.cause { background: #fff4f2; border: 1px solid #f1b7ae; padding: 8px 12px; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
table.ranks td { font-family: ui-monospace, monospace; font-size: 12px; white-space: nowrap; }
tr.stuck td, tr.straggler td { background: #fff4f2; font-weight: 600; }
.note { background: #fff; border: 1px solid var(--line); padding: 8px 12px; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0 0 8px; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; font-family: ui-monospace, monospace; font-size: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { width: 560px; max-width: 100%; height: auto; background: #fff; border: 1px solid var(--line); }
svg.chart .frame { fill: none; stroke: #b9bfcb; }
svg.chart .grid { stroke: #eceef2; }
svg.chart .tick, svg.chart .axis { font-size: 10px; fill: var(--muted); }
svg.chart .title { font-size: 13px; font-weight: 600; fill: var(--fg); }
svg.chart polyline.run { fill: none; stroke-width: 1.8; }
ul.legend { list-style: none; padding: 0; margin: 8px 0; display: flex; flex-wrap: wrap; gap: 4px 16px; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
svg.swatch { width: 12px; height: 12px; }
pre.log, pre.spec { background: #111723; color: #d8dee9; padding: 8px 12px; margin: 0; overflow: auto; max-height: 320px; font-size: 12px; line-height: 1.35; }
pre.log { white-space: pre-wrap; overflow-wrap: anywhere; }
td.id, td.id a { white-space: nowrap; }
form.filter { display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: center; margin: 0 0 12px; }
form.filter label { color: var(--muted); font-size: 12px; display: flex; gap: 6px; align-items: center; }
button.compare { background: var(--accent); color: #fff; border: 0; padding: 6px 14px; border-radius: 4px; font-weight: 600; cursor: pointer; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
p.shared .facet { display: inline-block; margin: 0 10px 2px 0; font-family: ui-monospace, monospace; font-size: 12px; }
.chartarea ul.legend { margin: 0 0 8px; }
pre.log.whole { max-height: none; }
a.whole { font-weight: normal; font-size: 12px; margin-left: 8px; }
th.facet { text-transform: none; letter-spacing: 0; }  /* env.MODE is not env.mode */
.logs { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 12px; }
.logs h3 { font-size: 13px; margin: 0 0 4px; }
button.cancel { background: #c0392b; color: #fff; border: 0; padding: 6px 14px; border-radius: 4px; font-weight: 600; cursor: pointer; }
button.cancel:hover { background: #a93226; }
[data-stale] { opacity: .6; }
details summary { cursor: pointer; color: var(--accent); margin: 8px 0; }
"""
