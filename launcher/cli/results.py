"""``ddpjob results`` (a table of a job's runs) and ``ddpjob plot`` (their curves). Imports only click at
start-up; the plot's matplotlib (``pip install 'ddpjob[plot]'``) only when a plot is drawn."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.support import guard
from launcher.cli.tools import complete_job_ids

if TYPE_CHECKING:
    from launcher.core.stepsplit import StepSplit
    from launcher.service.results import RunResult

# Shown first in the text table, in this order, when any run has them; samples/s last, final only.
MAIN_METRICS = ("loss", "eval_loss", "eval_accuracy")
RATE = "samples_per_s"
# The trainer's bookkeeping, left out of the text table's metric columns (still in -o json and csv);
# the step split and the peak memory get columns of their own.
TEXT_HIDDEN = frozenset({"lr", "step_time", "data_ms", "compute_ms", "comm_ms", "peak_memory_mb"})


def _load(job_id: str) -> tuple[str, str, list[RunResult]]:
    """The job's full id, its target and its runs' results."""
    from launcher.cli.specopts import jobs_service
    from launcher.service.results import job_results

    service = jobs_service()
    rec = service.get(job_id)
    return rec.id, rec.target, job_results(service, rec.id)


def metric_names(runs: list[RunResult]) -> list[str]:
    """Every metric any run has, sorted."""
    return sorted({m for r in runs for m in r.curves})


def _number(value: float | None, metric: str = "") -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.0f}" if metric == RATE else f"{value:.4g}"


def duration_text(seconds: float | None) -> str:
    """``4.8s``, ``1m20s``, ``2h05m`` (``-`` when unknown)."""
    from launcher.core.progress import duration

    return "-" if seconds is None else duration(seconds, tenths_below=60)


def run_label(run: RunResult, single: bool) -> str:
    """``lr=0.1 seed=1`` (a sweep's values), else ``run 0``."""
    if run.values:
        return " ".join(f"{k}={v}" for k, v in run.values.items())
    return "run" if single else f"run {run.index}"


def sort_runs(runs: list[RunResult], key: str) -> list[RunResult]:
    """By a metric's best value (best first), a sweep key's value or ``duration``; runs without it last.

    Raises:
        UsageError: ``key`` is none of these (while some run has metrics).
    """
    from launcher.core.errors import UsageError
    from launcher.service.results import higher_is_better

    metrics = metric_names(runs)
    keys = sorted({k for r in runs for k in r.values})
    if key in metrics:
        sign = -1.0 if higher_is_better(key) else 1.0
        return sorted(runs, key=lambda r: (key not in r.best, sign * r.best.get(key, 0.0)))
    if key in keys:
        return sorted(runs, key=lambda r: _value_order(r.values.get(key, _MISSING)))
    if key == "duration":
        return sorted(runs, key=lambda r: (r.duration_s is None, r.duration_s or 0.0))
    if not metrics:
        return runs  # nothing written yet: no order to give, and no reason to refuse
    raise UsageError(f"--sort {key}: no run of this job has a metric or sweep value {key!r}; "
                     f"metrics: {', '.join(metrics)}" + (f"; sweep values: {', '.join(keys)}" if keys else "")
                     + "; or duration")


_MISSING = object()


def _value_order(value: object) -> tuple[int, float, str]:
    """Numbers in numeric order, then text in text order, then runs without the value."""
    if value is _MISSING:
        return 2, 0.0, ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 0, float(value), ""
    return 1, 0.0, str(value)


def text_table(runs: list[RunResult]) -> list[str]:
    """One line per run: sweep values, state, duration, final and best of the main metrics, samples/s,
    the step split and the peak memory."""
    from launcher.core.stepsplit import MEMORY_KEY, run_split

    have = set(metric_names(runs))
    shown = [m for m in MAIN_METRICS if m in have]
    shown += [m for m in sorted(have) if m not in MAIN_METRICS and m not in TEXT_HIDDEN and m != RATE]
    keys = sorted({k for r in runs for k in r.values})
    header = ["RUN", *keys, "STATE", "DURATION"]
    for m in shown:
        header += [m, f"best {m}"]
    if RATE in have:
        header.append("samples/s")
    splits = {r.index: run_split(r.curves) for r in runs}
    if any(splits.values()):
        header.append("data/compute/comm")
    memory = MEMORY_KEY in have
    if memory:
        header.append("peak MiB")
    rows = [header]
    for r in runs:
        row = [str(r.index), *(str(r.values.get(k, "-")) for k in keys), r.state, duration_text(r.duration_s)]
        for m in shown:
            row += [_number(r.final.get(m), m), _number(r.best.get(m), m)]
        if RATE in have:
            row.append(_number(r.final.get(RATE), RATE))
        if any(splits.values()):
            split = splits[r.index]
            row.append(split.percents() if split else "-")
        if memory:
            peak = max((v for _, v in r.curves.get(MEMORY_KEY, [])), default=None)
            row.append(_number(peak, RATE))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN


def as_json(runs: list[RunResult]) -> list[dict[str, Any]]:
    from launcher.core.stepsplit import run_split

    return [{"index": r.index, "values": r.values, "state": r.state, "duration_s": r.duration_s,
             "final": {k: _finite(v) for k, v in sorted(r.final.items())},
             "best": {k: _finite(v) for k, v in sorted(r.best.items())}, "output_dir": r.output_dir,
             "step_split": _split_json(run_split(r.curves))} for r in runs]


def _split_json(split: StepSplit | None) -> dict[str, Any] | None:
    """A run's step split for -o json: milliseconds per step, shares, the bound part and the advice."""
    if split is None:
        return None
    return {"data_ms": round(split.data_ms, 3), "compute_ms": round(split.compute_ms, 3),
            "comm_ms": round(split.comm_ms, 3), "shares": {k: round(v, 3) for k, v in split.shares().items()},
            "bound": split.bound(), "advice": split.advice()}


def advice_lines(runs: list[RunResult]) -> list[str]:
    """The runs' advice (``stepsplit.grouped_advice``): one line per kind of bound, naming the runs."""
    from launcher.core.stepsplit import grouped_advice, run_split

    return grouped_advice([(run_label(r, len(runs) == 1), run_split(r.curves)) for r in runs])


def as_csv(runs: list[RunResult]) -> str:
    import csv
    import io

    keys = sorted({k for r in runs for k in r.values})
    metrics = metric_names(runs)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["index", *keys, "state", "duration_s", *(f"final.{m}" for m in metrics),
                     *(f"best.{m}" for m in metrics), "output_dir"])
    for r in runs:
        writer.writerow([r.index, *(r.values.get(k, "") for k in keys), r.state,
                         "" if r.duration_s is None else round(r.duration_s, 3),
                         *(r.final.get(m, "") for m in metrics), *(r.best.get(m, "") for m in metrics),
                         r.output_dir or ""])
    return out.getvalue()


def _notes(target: str, runs: list[RunResult]) -> list[str]:
    from launcher.service.results import UNREADABLE

    if not runs:
        return ["no runs: the job's submission did not complete (ddpjob status ID says why)"]
    if any(r.curves for r in runs):
        return []
    if target in UNREADABLE:
        return [f"no metrics: {UNREADABLE[target]}"]
    where = next((r.output_dir for r in runs if r.output_dir), None)
    return ["no metrics yet: each run's program appends JSON lines with a step to $DDPJOB_METRICS_FILE"
            + (f" ({where}/metrics.jsonl)" if where else "") + "; see ddpjob docs trainer (the metrics file)"]


@click.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--sort", "sort_key", metavar="METRIC", help="Order the runs by a metric's best value (best "
              "first: lowest, highest for accuracy-like metrics), a sweep value, or duration.")
@click.option("--output", "-o", type=click.Choice(["text", "json", "csv"]), default="text", show_default=True)
@guard
def results(job_id: str, sort_key: str | None, output: str) -> None:
    """Compare a job's runs: one row per run (each sweep element) with its sweep values, state,
    duration, the final and best value of each metric its metrics file holds, and where its steps'
    time went (data/compute/comm: waiting for batches, computing, waiting on the all-reduce the
    backward did not hide), with one line of advice for a run that waits mostly on data or network.

    \b
    Examples:
      ddpjob results sweep-ab12c                   # a table
      ddpjob results sweep-ab12c --sort eval_loss  # best run first
      ddpjob results sweep-ab12c -o csv > runs.csv

    Best is the lowest value, or the highest for accuracy-like names (acc, accuracy, f1, auc, score,
    *_per_s, ...). Any program's runs work, not only the reference trainer's: append JSON lines with
    a step to $DDPJOB_METRICS_FILE (ddpjob docs trainer). Local and Slurm runs are read here; Kubernetes
    runs write in their pods, so only their states are shown.
    """
    import json

    full_id, target, runs = _load(job_id)
    if sort_key:
        runs = sort_runs(runs, sort_key)
    if output == "json":
        click.echo(json.dumps({"id": full_id, "runs": as_json(runs)}, indent=2))
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
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--metric", "-m", default="loss", show_default=True, help="The metric to plot against step.")
@click.option("--output", "-o", "out", metavar="FILE", help="The image to write: .png, .svg or .pdf "
              "[default: ID-METRIC.png in the current folder].")
@click.option("--log-y", is_flag=True, help="A logarithmic y axis (losses that fall by orders of magnitude).")
@guard
def plot(job_id: str, metric: str, out: str | None, log_y: bool) -> None:
    """Plot a metric against step for every run of a job, one curve per run labelled by its sweep values.

    \b
    Examples:
      ddpjob plot sweep-ab12c                                # loss -> sweep-ab12c-loss.png
      ddpjob plot sweep-ab12c --metric eval_accuracy -o acc.svg
      ddpjob plot sweep-ab12c --log-y -o loss.pdf

    Needs matplotlib: pip install 'ddpjob[plot]' (without it: exit 3, naming the extra).
    """
    from launcher.core.errors import UsageError

    if out is not None and not out.lower().endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"-o {out}: the image's name must end in .png, .svg or .pdf")
    from launcher.cli.figure import draw, need_matplotlib

    need_matplotlib()
    full_id, target, runs = _load(job_id)
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
    click.echo(f"wrote {path}: {metric} of {len(drawn)} run(s)"
               + (f"; {missing} run(s) without {metric} yet left out" if missing else ""))


COMMANDS: list[Any] = [results, plot]
