"""``ddpjob results ID ID ...`` and ``ddpjob plot ID ID ...``: the runs of several jobs side by side,
with what differs between them as columns (``launcher.service.compare``). The commands themselves are
in ``launcher.cli.results``; this module prints and draws what they compare. Imports only click at
start-up."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from launcher.service.compare import ComparedRun, Comparison
    from launcher.service.results import RunResult


def load(job_ids: list[str]) -> Comparison:
    """Every job read before anything is printed: an unknown id (exit 4) leaves no half table."""
    from launcher.cli.specopts import jobs_service
    from launcher.service.compare import compare

    return compare(jobs_service(), job_ids)


def _as_results(cmp: Comparison) -> list[RunResult]:
    """Each run's results with its differing facets as its values (what ``text_table`` and ``sort_runs``
    read as columns), shortened for a table."""
    from launcher.service.compare import short

    return [dataclasses.replace(c.run, values={k: short(v) for k, v in cmp.differs(c).items()}) for c in cmp.runs]


def _sorted(cmp: Comparison, sort_key: str | None) -> list[ComparedRun]:
    from launcher.cli.runtable import sort_runs

    if not sort_key:
        return cmp.runs
    shown = _as_results(cmp)
    by_id = {id(r): c for r, c in zip(shown, cmp.runs)}
    return [by_id[id(r)] for r in sort_runs(shown, sort_key, whose="these jobs")]


def print_results(job_ids: list[str], sort_key: str | None, output: str) -> None:
    """The table (or JSON, YAML, CSV) of every run of the jobs, one row per run."""
    from launcher.cli.formats import MACHINE, echo
    from launcher.cli.runtable import advice_lines, as_json, text_table
    from launcher.service.compare import Comparison, short

    cmp = load(job_ids)
    cmp = Comparison(_sorted(cmp, sort_key), cmp.differing, cmp.shared, cmp.notes)
    if output in MACHINE:
        runs = [{"job": c.job_id, "label": c.label, "target": c.target, "differs": cmp.differs(c), **row}
                for c, row in zip(cmp.runs, as_json([c.run for c in cmp.runs]))]
        echo({"ids": list(dict.fromkeys(c.job_id for c in cmp.runs)), "shared": cmp.shared,
              "differing": cmp.differing, "runs": runs, "notes": [{"job": j, "why": why} for j, why in cmp.notes]},
             output)
    elif output == "csv":
        click.echo(_csv(cmp), nl=False)
    else:
        if cmp.shared:
            click.echo("shared: " + "  ".join(f"{k}={short(v)}" for k, v in cmp.shared.items()))
        shown = _as_results(cmp)
        for line in text_table(shown, labels=[c.label for c in cmp.runs], keys=cmp.differing):
            click.echo(line)
        for line in advice_lines(shown):
            click.echo(line)
    for job_id, why in cmp.notes:
        click.echo(f"{job_id}: {why}", err=True)


def _csv(cmp: Comparison) -> str:
    """``as_csv``'s columns with the job, the run's label and the differing facets in front."""
    import csv
    import io

    from launcher.cli.runtable import as_csv

    plain = list(csv.reader(io.StringIO(as_csv([c.run for c in cmp.runs]))))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    # as_csv's own value columns are the sweep keys: here the differing facets stand in their place.
    keys = sorted({k for c in cmp.runs for k in c.run.values})
    writer.writerow(["job", "run", "index", *cmp.differing, *plain[0][1 + len(keys):]])
    for c, row in zip(cmp.runs, plain[1:]):
        writer.writerow([c.job_id, c.label, c.run.index, *cmp.differs(c).values(), *row[1 + len(keys):]])
    return out.getvalue()


def draw_plot(job_ids: list[str], metric: str, out: str | None, log_y: bool) -> None:
    """One curve per run of the jobs, labelled by the run and its differing values."""
    from launcher.cli.figure import draw
    from launcher.core.errors import UsageError
    from launcher.service.compare import short

    cmp = load(job_ids)
    drawn = [c for c in cmp.runs if c.run.curves.get(metric)]
    if not drawn:
        metrics = sorted({m for c in cmp.runs for m in c.run.curves})
        if metrics:
            raise UsageError(f"--metric {metric}: no run of these jobs has it; their metrics: {', '.join(metrics)}")
        raise UsageError("nothing to plot: " + "; ".join(f"{j}: {why}" for j, why in cmp.notes))
    path = out or f"compare-{metric}.png"
    jobs = list(dict.fromkeys(c.job_id for c in cmp.runs))
    title = f"{metric}: {len(drawn)} task(s) of {len(jobs)} jobs"
    if cmp.shared:  # what every curve has in common, under the title (the legend says what differs)
        title += "\n" + " ".join(f"{k}={short(v, 24)}" for k, v in list(cmp.shared.items())[:4])
    draw([(cmp.label(c), c.run.curves[metric]) for c in drawn], metric, title, path, log_y=log_y)
    missing = [c.label for c in cmp.runs if not c.run.curves.get(metric)]
    click.echo(f"wrote {path}: {metric} of {len(drawn)} task(s) of {len(jobs)} jobs"
               + (f"; without {metric}: {', '.join(missing)}" if missing else ""))
    for job_id, why in cmp.notes:
        click.echo(f"{job_id}: {why}", err=True)
