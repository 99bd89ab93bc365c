"""The dashboard's compare view: the runs of the jobs ticked on the jobs page side by side, as
``ddpjob results ID ID ...`` lines them up (``launcher.service.compare``): what they share in one line,
what differs as columns, each run's state, duration and metrics, and their curves overlaid, one
colour per run, with one legend naming each run and its differing values."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from launcher.ui.pages import (
    EMPTY,
    MAX_CHARTS,
    PREFERRED,
    SUMMARY_METRICS,
    chart_area,
    duration,
    job_path,
    last_best,
    page,
    state_badge,
    url,
)
from launcher.ui.svg import chart, colour

if TYPE_CHECKING:
    from launcher.service.compare import Comparison

NO_JOBS = ("Tick two or more jobs on the jobs page, then press <em>Compare the ticked jobs</em>: their runs "
           "are shown side by side here.")


def compare_page(cmp: Comparison | None, token: str, home: str) -> str:
    """The page (``cmp`` None: no job was ticked, and the page says how to tick them)."""
    back = f"<p><a href=\"{url('/', token)}\">All jobs</a></p>"
    if cmp is None:
        return page("ddpjob: compare", f"<h1>Compare jobs</h1><p class=\"muted\">{NO_JOBS}</p>{back}", token, home)
    from launcher.service.compare import short

    jobs = list(dict.fromkeys(c.job_id for c in cmp.runs))
    parts = [f"<h1>Compare {len(cmp.runs)} task(s) of {len(jobs)} job(s)</h1>", back]
    if cmp.shared:
        shared = " ".join(f"<span class=\"facet\">{escape(k)}={escape(short(v))}</span>" for k, v in cmp.shared.items())
        parts.append(f"<p class=\"shared\"><span class=\"muted\">All share:</span> {shared}</p>")
    if not cmp.differing and len(cmp.runs) > 1:
        parts.append("<p class=\"muted\">Nothing recorded tells these runs apart (same spec, target and shape).</p>")
    for job_id, why in cmp.notes:
        parts.append(f"<p class=\"note\">{escape(job_id)}: {escape(why)}</p>")
    shown = [m for m in SUMMARY_METRICS if any(m in c.run.final for c in cmp.runs)]
    head = "".join(f"<th class=\"facet\">{escape(k)}</th>" for k in cmp.differing)
    head += "".join(f"<th>{escape(m)} (last / best)</th>" for m in shown)
    rows = [f"<table class=\"runs compare\"><thead><tr><th>Run</th>{head}<th>State</th><th>Duration</th></tr></thead><tbody>"]
    for i, c in enumerate(cmp.runs):
        task = c.run.index if c.label != c.job_id else None
        facets = "".join(f"<td>{escape(short(v)) if v != '-' else EMPTY}</td>" for v in cmp.differs(c).values())
        values = "".join(f"<td class=\"num\">{last_best(c.run, m)}</td>" for m in shown)
        rows.append(f"<tr data-run=\"{escape(c.label)}\"><td class=\"id\"><svg class=\"swatch\" viewBox=\"0 0 12 12\">"
                    f"<rect width=\"12\" height=\"12\" fill=\"{colour(i)}\"/></svg> "
                    f"<a href=\"{url(job_path(c.job_id), token, task=task)}\">{escape(c.label)}</a></td>{facets}{values}"
                    f"<td>{state_badge(c.run.state)}</td><td class=\"num\">{duration(c.run.duration_s) or EMPTY}</td></tr>")
    rows.append("</tbody></table>")
    parts.append("".join(rows))
    have = {m for c in cmp.runs for m in c.run.curves}
    metrics = [m for m in PREFERRED if m in have] + sorted(have - set(PREFERRED))
    labels = [(cmp.label(c), colour(i)) for i, c in enumerate(cmp.runs)]
    charts = [chart(m, [(label, col, c.run.curves.get(m, [])) for (label, col), c in zip(labels, cmp.runs)])
              for m in metrics[:MAX_CHARTS]]
    if charts:
        parts.append("<h2>Curves</h2>" + chart_area(charts, labels))
    return page("ddpjob: compare", "".join(parts), token, home)
