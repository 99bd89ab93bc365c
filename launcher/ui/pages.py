"""The dashboard's HTML: the jobs table and the job page, each a page around a live part that the
page's script replaces every two seconds with a fresh render of the same function. Every value
from a job (names, messages, log lines, the spec) is escaped."""

from __future__ import annotations

import dataclasses
import time
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from launcher.core.progress import describe
from launcher.core.stepsplit import StepSplit, grouped_advice, run_split
from launcher.targets.shared.runfolder import PLAN_TEXT
from launcher.ui.svg import chart, colour, legend
from launcher.ui.view import JobFilter

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from launcher.core.progress import Progress
    from launcher.service.results import RunResult
    from launcher.ui.view import JobRow, JobView

# Charts first for these metrics, in this order, then any other the runs write (at most MAX_CHARTS).
PREFERRED = ("loss", "eval_loss", "eval_accuracy", "samples_per_s", "lr")
MAX_CHARTS = 6
SUMMARY_METRICS = ("loss", "eval_loss", "eval_accuracy", "samples_per_s")


def link(path: str, token: str, **params: object) -> str:
    """``path`` with the token (and ``params`` that are not None) as its query."""
    return f"{path}?{urlencode({'token': token, **{k: v for k, v in params.items() if v is not None}})}"


def url(path: str, token: str, **params: object) -> str:
    """``link`` escaped for an HTML attribute."""
    return escape(link(path, token, **params))


def job_path(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='')}"


def age(seconds: float) -> str:
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def duration(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``3m05s``, ``2h10m`` ('' when unknown)."""
    from launcher.core.progress import duration as written

    return "" if seconds is None else written(seconds, tenths_below=10)


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def state_badge(state: str) -> str:
    return f'<span class="state state-{escape(state)}">{escape(state)}</span>'


def page(title: str, body: str, token: str, home: str) -> str:
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"  # no favicon request (it would need the token)
            f"<title>{escape(title)}</title><link rel=\"stylesheet\" href=\"{url('/static/style.css', token)}\">"
            f"</head><body><header><a href=\"{url('/', token)}\">ddpjob</a>"
            f"<span class=\"where\">jobs in {escape(home)}</span></header><main>{body}</main>"
            f"<script src=\"{url('/static/app.js', token)}\"></script></body></html>")


# --------------------------------------------------------------------------- the jobs table

EMPTY = "\u2014"  # an em dash: a cell with nothing to say (not a bare "/" or "-" that reads as a value)


def jobs_page(token: str, home: str, live: str, flt: JobFilter | None = None) -> str:
    """The jobs table under its filter (state, target, name: a plain GET form, so the filter is in the
    address and a reload keeps it), inside the form that sends the ticked jobs to the compare view."""
    from launcher.core.plugins import target_names
    from launcher.core.states import JobState

    flt = flt or JobFilter()

    def options(chosen: str, values: list[str], everything: str) -> str:
        return f"<option value=\"\">{everything}</option>" + "".join(
            f"<option{' selected' if v == chosen else ''}>{escape(v)}</option>" for v in values)

    form = ("<form class=\"filter\" method=\"get\" action=\"/\">"
            f"<input type=\"hidden\" name=\"token\" value=\"{escape(token)}\">"
            f"<label>State <select name=\"state\">{options(flt.state, [s.value for s in JobState], 'any')}</select></label>"
            f"<label>Target <select name=\"target\">{options(flt.target, list(target_names()), 'any')}</select></label>"
            f"<label>Name <input type=\"search\" name=\"name\" value=\"{escape(flt.name)}\" "
            "placeholder=\"part of the id or name\"></label><button type=\"submit\">Filter</button>"
            + (f" <a href=\"{url('/', token)}\">show all</a>" if flt.active else "") + "</form>")
    live_url = url("/live/jobs", token, **flt.params())
    body = (f"<h1>Jobs</h1>{form}<form class=\"compare\" method=\"get\" action=\"/compare\">"
            f"<input type=\"hidden\" name=\"token\" value=\"{escape(token)}\">"
            f"<div id=\"jobs\" data-live=\"{live_url}\">{live}</div>"
            "<p><button type=\"submit\" class=\"compare\">Compare the ticked jobs</button> "
            "<span class=\"muted\">their runs side by side: what differs between them, and their curves overlaid "
            "(as <code>ddpjob results ID ID ...</code>)</span></p></form>")
    return page("ddpjob: jobs", body, token, home)


def progress_cell(progress: Progress | None) -> str:
    if not progress:
        return ""
    step, total = progress.step, progress.total_steps
    bar = (f'<progress max="{total}" value="{min(step, total)}"></progress>'
           if isinstance(step, int) and isinstance(total, int) and total > 0 else "")
    run = f" (run {progress.task})" if progress.task is not None else ""
    return bar + escape(describe(progress) + run)


def jobs_table(rows: list[JobRow], token: str, now: float | None = None, filtered: bool = False) -> str:
    """The jobs, newest first: a tick box (compare), id, target, state, progress, nodes, age and message."""
    if not rows and filtered:
        return '<p class="muted none">No job matches the filter.</p>'
    if not rows:
        return ('<p class="muted">No jobs yet. Submit one with <code>ddpjob submit jobs/quickstart.yaml '
                '--target local --nodes 2</code>; it appears here.</p>')
    now = time.time() if now is None else now
    out = ["<table class=\"jobs\"><thead><tr><th><span class=\"sr\">Compare</span></th><th>ID</th><th>Target</th>"
           "<th>State</th><th>Progress</th><th>Nodes</th><th>Age</th><th>Message</th></tr></thead><tbody>"]
    for row in rows:
        r = row.rec
        nodes = (r.shape.nodes if r.shape else r.summary.nodes) or EMPTY
        out.append(f"<tr data-job=\"{escape(r.id)}\"><td><input type=\"checkbox\" name=\"id\" value=\"{escape(r.id)}\" "
                   f"aria-label=\"compare {escape(r.id)}\"></td>"
                   f"<td class=\"id\"><a href=\"{url(job_path(r.id), token)}\">{escape(r.id)}</a></td>"
                   f"<td>{escape(r.target)}</td><td class=\"state-cell\">{state_badge(r.state.value)}</td>"
                   f"<td class=\"progress\">{progress_cell(row.progress) or EMPTY}</td><td class=\"num\">{escape(str(nodes))}</td>"
                   f"<td class=\"age\" title=\"{escape(when(r.created_at))}\">{age(now - r.created_at)}</td>"
                   f"<td class=\"message\">{escape(r.message[:200])}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


# --------------------------------------------------------------------------- one job

def job_page(view: JobView, token: str, home: str, live: str, spec: str, plan: str | None,
             chosen: int | None = None) -> str:
    """The job page; its live part follows run ``chosen``, or else always the latest run started."""
    rec = view.rec
    parts = [f"<h1>{escape(rec.id)} <span class=\"muted\">({escape(rec.target)})</span></h1>",
             f"<div id=\"job\" data-live=\"{url(job_path(rec.id) + '/live', token, task=chosen)}\">{live}</div>",
             f"<h2>Spec</h2><p class=\"muted\">As submitted; secret-looking values are shown as ***.</p>"
             f"<pre class=\"spec\">{escape(spec)}</pre>"]
    if plan:
        parts.append(f"<details><summary>Plan (what was submitted: {PLAN_TEXT})</summary><pre class=\"spec\">{escape(plan)}</pre>"
                     "</details>")
    return page(f"ddpjob: {rec.id}", "".join(parts), token, home)


def run_label(run: RunResult) -> str:
    values = " ".join(f"{k}={v}" for k, v in run.values.items())
    return f"run {run.index}" + (f": {values}" if values else "")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def last_best(run: RunResult, metric: str) -> str:
    """``0.41 / 0.38``: the run's last and best value of ``metric`` (an em dash where it has none)."""
    if metric not in run.final and metric not in run.best:
        return EMPTY
    return f"{_num(run.final.get(metric)) or EMPTY} / {_num(run.best.get(metric)) or EMPTY}"


def runs_section(view: JobView, token: str) -> str:
    runs = view.runs
    if not runs:
        return "<h2>Runs</h2><p class=\"muted\">No run has written metrics here yet.</p>"
    shown = [m for m in SUMMARY_METRICS if any(m in r.final for r in runs)]
    head = "".join(f"<th>{escape(m)} (last / best)</th>" for m in shown)
    splits = {r.index: run_split(r.curves) for r in runs}
    if any(splits.values()):
        head += "<th title=\"where each step's time went: waiting for data, computing, waiting on the all-reduce the backward did not hide\">Step: data / compute / comm</th>"
    out = [f"<h2>Runs</h2><table class=\"runs\"><thead><tr><th>Run</th><th>Values</th><th>State</th><th>Duration</th>{head}"
           "<th>Logs</th></tr></thead><tbody>"]
    for r in runs:
        values = escape(" ".join(f"{k}={v}" for k, v in r.values.items())) or EMPTY
        cells = "".join(f"<td class=\"num\">{last_best(r, m)}</td>" for m in shown)
        if any(splits.values()):
            cells += f"<td class=\"num\">{split_cell(splits[r.index])}</td>"
        link = ("shown below" if r.index == view.task
                else f"<a href=\"{url(job_path(view.rec.id), token, task=r.index)}\">show</a>")
        out.append(f"<tr data-run=\"{r.index}\"><td><svg class=\"swatch\" viewBox=\"0 0 12 12\"><rect width=\"12\" "
                   f"height=\"12\" fill=\"{colour(r.index)}\"/></svg> {r.index}</td><td>{values}</td>"
                   f"<td>{state_badge(r.state)}</td><td class=\"num\">{duration(r.duration_s) or EMPTY}</td>"
                   f"{cells}<td>{link}</td></tr>")
    out.append("</tbody></table>")
    for hint in grouped_advice([(run_label(r), splits[r.index]) for r in runs]):
        out.append(f"<p class=\"note advice\">{escape(hint)}</p>")
    metrics = [m for m in PREFERRED if any(m in r.curves for r in runs)]
    # Then the others that change (a constant, such as the evaluation's sample count, says nothing).
    metrics += sorted(m for m in {m for r in runs for m in r.curves} - set(metrics)
                      if len({v for r in runs for _, v in r.curves.get(m, [])}) > 1)
    charts = [chart(m, [(run_label(r), colour(r.index), r.curves.get(m, [])) for r in runs]) for m in metrics[:MAX_CHARTS]]
    if charts:
        out.append(chart_area(charts, [(run_label(r), colour(r.index)) for r in runs]))
    return "".join(out)


def chart_area(charts: list[str], labels: list[tuple[str, str]]) -> str:
    """The legend right above the first charts (one legend for all; under the last row it was far from
    the first charts), then the charts."""
    return f"<div class=\"chartarea\">{legend(labels)}<div class=\"charts\">{''.join(charts)}</div></div>"


def split_cell(split: StepSplit | None) -> str:
    """``3% / 85% / 12%`` of a run's step split ('-' without one)."""
    return "-" if split is None else split.percents(" / ")


def nodes_section(view: JobView) -> str:
    st = view.status
    task = next((t for t in st.tasks if t.index == view.task), None) if st else None
    title = f"<h2>Nodes and ranks{f' of run {view.task}' if len(view.runs) > 1 else ''}</h2>"
    if task is None or not task.nodes:
        return title + "<p class=\"muted\">No node has started yet.</p>"
    ppn = view.procs_per_node
    out = [title, "<table class=\"nodes\"><thead><tr><th>Node</th><th>Ranks</th><th>Details</th><th>Log</th></tr></thead><tbody>"]
    for n in task.nodes:
        node = n.node
        ranks = (f"{node * ppn}" + (f"-{node * ppn + ppn - 1}" if ppn > 1 else "")
                 if isinstance(node, int) and ppn else "?")
        extra = " ".join(f"{k}={v}" for k, v in n.details() if v != "")
        out.append(f"<tr><td>{escape(str(node))}</td><td>{ranks}</td><td>{escape(extra)}</td>"
                   f"<td><code>{escape(n.log or '')}</code></td></tr>")
    out.append("</tbody></table>")
    if task.message:
        out.append(f"<p>Run {task.index}: {escape(task.message)}</p>")
    if task.losses:  # nodes lost for good and how the run came back (recovery:)
        out.append(f"<h3>Lost nodes <span class=\"muted\">({escape(task.losses_note())})</span></h3><ul class=\"losses\">"
                   + "".join(f"<li>{escape(loss.line())}</li>" for loss in task.losses) + "</ul>")
    source = (st.source or "") if st else ""
    if source.startswith("ddpjob's record"):  # the scheduler was not asked (Target.recorded_status)
        out.append(f"<p class=\"muted\">From {escape(source)}</p>")
    return "".join(out)


def health_section(view: JobView) -> str:
    """Every rank, node by node: what ``ddpjob top`` shows (``launcher.targets.shared.health.rows``)."""
    from launcher.targets.shared.health import COLUMNS, JobHealth, notes, rows

    health = view.health
    if not isinstance(health, JobHealth):
        return ""
    note = f"<p class=\"cause\">{escape(health.note)}</p>" if health.note else ""
    sampled = f" sampled {age(time.time() - health.updated)} ago" if health.updated else ""
    out = [f"<h2>Ranks <span class=\"muted\">(<code>ddpjob top {escape(view.rec.id)}</code>;{sampled})</span></h2>",
           note, "<table class=\"ranks\"><thead><tr>", *(f"<th>{escape(c)}</th>" for c in COLUMNS), "</tr></thead><tbody>"]
    for row in rows(health):
        flag = f" class=\"{escape(row[-1].lower())}\"" if row[-1] else ""
        out.append(f"<tr{flag}>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>")
    out.append("</tbody></table>")
    out += [f"<p class=\"muted\">{escape(line)}</p>" for line in notes(health)]
    return "".join(out)


def logs_section(view: JobView, token: str) -> str:
    if not view.logs:
        return ""
    out = [f"<h2>Logs <span class=\"muted\">(last lines of each node; <code>ddpjob logs {escape(view.rec.id)}"
           f"{' --task ' + str(view.task) if len(view.runs) > 1 else ''} -f</code> follows them)</span></h2><div class=\"logs\">"]
    task = view.task if len(view.runs) > 1 else None
    for node, lines in view.logs:
        text = "\n".join(lines) if lines else "(nothing yet)"
        whole = url(job_path(view.rec.id) + "/log", token, node=node, task=task)
        out.append(f"<div><h3>node {node} <a class=\"whole\" href=\"{whole}\" data-node=\"{node}\">whole log</a></h3>"
                   f"<pre class=\"log\" data-node=\"{node}\">{escape(text)}</pre></div>")
    out.append("</div>")
    if view.nodes > len(view.logs):
        rest = ", ".join(f"<a href=\"{url(job_path(view.rec.id) + '/log', token, node=n, task=task)}\">node {n}</a>"
                         for n in range(len(view.logs), view.nodes))
        out.append(f"<p class=\"muted\">Nodes {len(view.logs)}..{view.nodes - 1} are not shown here; their whole logs: "
                   f"{rest} (or <code>ddpjob logs {escape(view.rec.id)} --node N</code>)</p>")
    return "".join(out)


def whole_log(job_id: str, node: int, task: int | None, lines: Iterable[str], token: str, home: str) -> Iterator[str]:
    """A node's whole log as a page, sent as it is read (a log of any size in little memory)."""
    run = f" of run {task}" if task is not None else ""
    top, bottom = page(f"ddpjob: {job_id} node {node}", "\0", token, home).split("\0")
    yield (f"{top}<h1>{escape(job_id)}: node {node}{run}, whole log</h1><p><a href=\"{url(job_path(job_id), token)}\">"
           f"Back to the job</a> <span class=\"muted\">(as <code>ddpjob logs {escape(job_id)} --node {node}"
           f"{f' --task {task}' if task is not None else ''}</code>)</span></p><pre class=\"log whole\">")
    for line in lines:
        yield escape(line) + "\n"
    yield f"</pre>{bottom}"


def job_live(view: JobView, token: str, now: float | None = None) -> str:
    """The part of the job page that follows the job: state, root cause, progress, cancel, runs with
    their curves, nodes and ranks, and each node's last log lines."""
    rec = view.rec
    now = time.time() if now is None else now
    facts = [("state", state_badge(rec.state.value)), ("created", f"{when(rec.created_at)} ({age(now - rec.created_at)} ago)")]
    if rec.started_at:
        facts.append(("started", when(rec.started_at)))
    if rec.ended_at:
        facts.append(("ended", when(rec.ended_at)))
    if rec.state.value != "PENDING":  # as status and list date it: the target's start to its end, or to now
        facts.append(("duration", duration(rec.duration_s(now))))
    if view.progress:  # no ETA once the job has ended
        shown = dataclasses.replace(view.progress, eta_s=None) if rec.state.terminal else view.progress
        facts.append(("progress", progress_cell(shown)))
        if (split := view.progress.split()) is not None:
            facts.append(("step", escape(split.text()) + "".join(
                f"<div class=\"note advice\">{escape(hint)}</div>" for hint in [split.advice()] if hint)))
    facts.append(("run dir", f"<code>{escape(rec.run_dir)}</code>"))
    out = ["<dl class=\"facts\">", *(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts), "</dl>"]
    if rec.message:
        failed = rec.state.value == "FAILED"
        out.append(f"<h2>{'Root cause' if failed else 'Message'}</h2>"
                   f"<div class=\"{'cause' if failed else 'note'}\">{escape(rec.message)}</div>")
    for problem in view.problems:
        out.append(f"<p class=\"cause\">{escape(problem)}</p>")
    if rec.state.terminal:
        out.append("<span data-final=\"1\"></span>")
    else:
        out.append(f"<form class=\"cancel\" method=\"post\" action=\"{url(job_path(rec.id) + '/cancel', token)}\" "
                   f"data-confirm=\"Cancel {escape(rec.id)}? Every process of the job is stopped.\">"
                   "<button class=\"cancel\" type=\"submit\">Cancel job</button></form>")
    out += [runs_section(view, token), nodes_section(view), health_section(view), logs_section(view, token)]
    return "".join(out)
