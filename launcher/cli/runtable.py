"""The runs' table as text, JSON and CSV, and their orders: what ``ddpjob results`` prints for one job
(``launcher.cli.results``) or several (``launcher.cli.compare``). Imports only click at start-up."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.core.stepsplit import StepSplit
    from launcher.service.results import RunResult

# Shown first in the text table, in this order, when any run has them; samples/s last, final only.
MAIN_METRICS = ("loss", "eval_loss", "eval_accuracy")
RATE = "samples_per_s"
# Left out of the text table's metric columns (still in -o json and csv): the step split and the peak
# memory get columns of their own. Every other metric (lr, step_time, a user's own) gets its two.
TEXT_HIDDEN = frozenset({"data_ms", "compute_ms", "comm_ms", "peak_memory_mb"})
# Settings a program logs rather than scores it earns: their last value only (a "best" learning rate means nothing).
LAST_ONLY = frozenset({"lr", "learning_rate"})


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


def sort_runs(runs: list[RunResult], key: str, whose: str = "this job") -> list[RunResult]:
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
    raise UsageError(f"--sort {key}: no run of {whose} has a metric or {'value' if whose != 'this job' else 'sweep value'} "
                     f"{key!r}; metrics: {', '.join(metrics)}"
                     + (f"; {'values' if whose != 'this job' else 'sweep values'}: {', '.join(keys)}" if keys else "")
                     + "; or duration")


_MISSING = object()


def _value_order(value: object) -> tuple[int, float, str]:
    """Numbers in numeric order, then text in text order, then runs without the value."""
    if value is _MISSING:
        return 2, 0.0, ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 0, float(value), ""
    return 1, 0.0, str(value)


def text_table(runs: list[RunResult], labels: list[str] | None = None, keys: list[str] | None = None) -> list[str]:
    """One line per run: sweep values, state, duration, final and best of the main metrics, samples/s,
    the step split and the peak memory. ``labels``: the RUN column (default: each run's index);
    ``keys``: the value columns, in this order (default: every sweep key, sorted)."""
    from launcher.core.stepsplit import MEMORY_KEY, run_split

    have = set(metric_names(runs))
    shown = [m for m in MAIN_METRICS if m in have]
    shown += [m for m in sorted(have) if m not in MAIN_METRICS and m not in TEXT_HIDDEN and m != RATE]
    keys = sorted({k for r in runs for k in r.values}) if keys is None else keys
    header = ["RUN", *keys, "STATE", "DURATION"]
    for m in shown:
        # A metric named like a value column (a sweep over lr, the trainer logging lr) is "last lr".
        header.append(f"last {m}" if m in keys else m)
        if m not in LAST_ONLY:
            header.append(f"best {m}")
    if RATE in have:
        header.append("samples/s")
    splits = [run_split(r.curves) for r in runs]
    if any(splits):
        header.append("data/compute/comm")
    memory = MEMORY_KEY in have
    if memory:
        header.append("peak MiB")
    lossy = any(r.lost_nodes for r in runs)  # nodes lost for good, brought back (ddpjob status tells how)
    if lossy:
        header += ["lost nodes", "goodput"]
    rows = [header]
    for i, r in enumerate(runs):
        row = [labels[i] if labels else str(r.index), *(str(r.values.get(k, "-")) for k in keys), r.state,
               duration_text(r.duration_s)]
        for m in shown:
            row.append(_number(r.final.get(m), m))
            if m not in LAST_ONLY:
                row.append(_number(r.best.get(m), m))
        if RATE in have:
            row.append(_number(r.final.get(RATE), RATE))
        if any(splits):
            split = splits[i]
            row.append(split.percents() if split else "-")
        if memory:
            peak = max((v for _, v in r.curves.get(MEMORY_KEY, [])), default=None)
            row.append(_number(peak, RATE))
        if lossy:
            row += [str(r.lost_nodes), "-" if r.goodput is None else f"{100 * r.goodput:.0f}%"]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN


def as_json(runs: list[RunResult]) -> list[dict[str, object]]:
    from launcher.core.stepsplit import run_split

    return [{"index": r.index, "values": r.values, "state": r.state, "duration_s": r.duration_s,
             "final": {k: _finite(v) for k, v in sorted(r.final.items())},
             "best": {k: _finite(v) for k, v in sorted(r.best.items())}, "output_dir": r.output_dir,
             "step_split": _split_json(run_split(r.curves)), "lost_nodes": r.lost_nodes,
             "goodput": None if r.goodput is None else round(r.goodput, 4)} for r in runs]


def _split_json(split: StepSplit | None) -> dict[str, object] | None:
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
