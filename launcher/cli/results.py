"""``ddpjob results`` (a table of a job's runs) and ``ddpjob plot`` (their curves). Imports only click at
start-up; the plot's matplotlib (``pip install 'ddpjob[plot]'``) only when a plot is drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from launcher.cli.formats import MACHINE, echo
from launcher.cli.runtable import advice_lines, as_csv, as_json, metric_names, run_label, sort_runs, text_table
from launcher.cli.support import guard
from launcher.cli.tools import complete_job_ids

if TYPE_CHECKING:
    from launcher.service.results import RunResult


def _load(job_id: str) -> tuple[str, str, list[RunResult]]:
    """The job's full id, its target and its runs' results."""
    from launcher.cli.specopts import jobs_service
    from launcher.service.results import job_results

    service = jobs_service()
    rec = service.get(job_id)
    return rec.id, rec.target, job_results(service, rec.id)


def _notes(target: str, runs: list[RunResult]) -> list[str]:
    from launcher.service.results import metrics_elsewhere

    if not runs:
        return ["no runs: the job's submission did not complete (ddpjob status ID says why)"]
    if any(r.curves for r in runs):
        return []
    if elsewhere := metrics_elsewhere(target):
        return [f"no metrics: {elsewhere}"]
    where = next((r.output_dir for r in runs if r.output_dir), None)
    return ["no metrics yet: each run's program appends JSON lines with a step to $DDPJOB_METRICS_FILE"
            + (f" ({where}/metrics.jsonl)" if where else "") + "; see ddpjob docs trainer (the metrics file)"]


@click.command()
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, shell_complete=complete_job_ids)
@click.option("--sort", "sort_key", metavar="METRIC", help="Order the tasks by a metric's best value (best "
              "first: lowest, highest for accuracy-like metrics), a sweep value (with several jobs: any "
              "value that differs), or duration.")
@click.option("--output", "-o", type=click.Choice(["text", "json", "yaml", "csv"], case_sensitive=False), default="text",
              show_default=True, help="json or yaml: every task's values, final and best metrics, step split; csv: one row per task.")
@guard
def results(job_ids: tuple[str, ...], sort_key: str | None, output: str) -> None:
    """Compare a job's tasks: one row per task (each combination of a sweep) with its sweep values, state,
    duration, the final and best value of each metric its metrics file holds, and where its steps'
    time went (data/compute/comm: waiting for batches, computing, waiting on the all-reduce the
    backward did not hide), with one line of advice for a task that waits mostly on data or network.

    \b
    Examples:
      ddpjob results sweep-ab12c                   # a table
      ddpjob results sweep-ab12c --sort eval_loss  # best task first
      ddpjob results sweep-ab12c -o csv > runs.csv
      ddpjob results base-k3m2p amp-x7q4r          # two jobs side by side

    With several IDs, every run of every job is a row, named ID (ID/N for run N of a sweep), and what
    tells the runs apart becomes columns: target, nodes, procs, image (its digest), the spec's values
    (env.NAME, each command option as "command --lr", ...) and sweep values. What they all share is
    one line above the table. Nothing leaves this machine: it reads what each job recorded.

    Best is the lowest value, or the highest for accuracy-like names (acc, accuracy, f1, auc, score,
    *_per_s, ...). Any program's runs work, not only the reference trainer's: append JSON lines with
    a step to $DDPJOB_METRICS_FILE (ddpjob docs trainer). Local and Slurm runs are read here; Kubernetes
    runs write in their pods, so only their states are shown.
    """
    if len(set(job_ids)) > 1:
        from launcher.cli.compare import print_results

        print_results(list(job_ids), sort_key, output)
        return
    full_id, target, runs = _load(job_ids[0])
    if sort_key:
        runs = sort_runs(runs, sort_key)
    if output in MACHINE:
        echo({"id": full_id, "runs": as_json(runs)}, output)
    elif output == "csv":
        click.echo(as_csv(runs), nl=False)
    else:
        for line in text_table(runs):
            click.echo(line)
        for line in advice_lines(runs):
            click.echo(line)
    for note in _notes(target, runs):
        click.echo(note, err=True)


@click.command()
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True, shell_complete=complete_job_ids)
@click.option("--metric", "-m", default="loss", show_default=True, help="The metric to plot against step.")
@click.option("--output", "-o", "out", metavar="FILE", help="The image to write: .png, .svg or .pdf "
              "[default: ID-METRIC.png in the current folder; compare-METRIC.png for several IDs].")
@click.option("--log-y", is_flag=True, help="A logarithmic y axis (losses that fall by orders of magnitude).")
@guard
def plot(job_ids: tuple[str, ...], metric: str, out: str | None, log_y: bool) -> None:
    """Plot a metric against step for every task of a job, one curve per task labelled by its sweep values.

    \b
    Examples:
      ddpjob plot sweep-ab12c                                # loss -> sweep-ab12c-loss.png
      ddpjob plot sweep-ab12c --metric eval_accuracy -o acc.svg
      ddpjob plot sweep-ab12c --log-y -o loss.pdf
      ddpjob plot base-k3m2p amp-x7q4r -o both.png           # one curve per task of both jobs

    With several IDs, one curve per task of every job, each labelled by the task (ID, or ID/N in a sweep)
    and the values that differ between the tasks (as ddpjob results ID ID ... shows them as columns).

    Needs matplotlib: pip install 'ddpjob[plot]' (without it: exit 3, naming the extra).
    """
    from launcher.core.errors import UsageError

    if out is not None and not out.lower().endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"-o {out}: the image's name must end in .png, .svg or .pdf")
    from launcher.cli.figure import draw, need_matplotlib

    need_matplotlib()
    if len(set(job_ids)) > 1:
        from launcher.cli.compare import draw_plot

        draw_plot(list(job_ids), metric, out, log_y)
        return
    full_id, target, runs = _load(job_ids[0])
    drawn = [r for r in runs if r.curves.get(metric)]
    if not drawn:
        metrics = metric_names(runs)
        if metrics:
            raise UsageError(f"--metric {metric}: no run of {full_id} has it; its metrics: {', '.join(metrics)}")
        raise UsageError(f"nothing to plot: {' '.join(_notes(target, runs))}")
    path = out or f"{full_id}-{metric}.png"
    draw([(run_label(r, len(runs) == 1), r.curves[metric]) for r in drawn], metric, f"{full_id}: {metric}", path,
         log_y=log_y)
    missing = len(runs) - len(drawn)
    click.echo(f"wrote {path}: {metric} of {len(drawn)} task(s)"
               + (f"; {missing} task(s) without {metric} yet left out" if missing else ""))

