"""Each run's results from its metrics file: sweep values, state, final and best metrics, curves.

A MINIMAL STAND-IN with the interface of the ``results`` module written for ``ddpjob results``
(issue 26 item 1), so that the dashboard (``launcher.ui``) can be built beside it; that module
replaces this one. It reads the lines of a run's ``metrics.jsonl`` that have an integer ``step``
(``launcher.core.progress`` describes the format) and keeps every other number as a metric.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs

# Keys of a metrics line that are bookkeeping, not metrics.
_NOT_METRICS = frozenset({"step", "total_steps", "time", "epoch", "world_size"})
_MAX_LINES = 200_000  # a run's file is read up to this many lines


@dataclass(frozen=True)
class RunResult:
    """One run of a job (a sweep element, or the only run)."""

    index: int
    values: dict[str, object]
    state: str
    duration_s: float | None
    final: dict[str, float]
    best: dict[str, float]
    curves: dict[str, list[tuple[int, float]]]  # metric -> [(step, value)]
    output_dir: str | None


def _lower_is_better(metric: str) -> bool:
    return "loss" in metric or metric.endswith("time") or "error" in metric


def read_run(path: str) -> tuple[dict[str, list[tuple[int, float]]], float | None]:
    """The curves of one metrics file and the seconds between its first and last dated line."""
    curves: dict[str, list[tuple[int, float]]] = {}
    times: list[float] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f):
                if n >= _MAX_LINES:
                    break
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                step = rec.get("step") if isinstance(rec, dict) else None
                if not isinstance(step, int) or isinstance(step, bool):
                    continue
                if isinstance(rec.get("time"), (int, float)):
                    times.append(float(rec["time"]))
                for key, value in rec.items():
                    if (key not in _NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool)
                            and math.isfinite(value)):
                        curves.setdefault(key, []).append((step, float(value)))
    except OSError:
        return {}, None
    return curves, (max(times) - min(times) if len(times) > 1 else None)


def job_results(jobs: Jobs, job_id: str) -> list[RunResult]:
    """One ``RunResult`` per run of the job, in run order; [] before the job has a handle."""
    from launcher.targets import get_target

    rec, st = jobs.refresh(job_id)
    if rec.handle is None or st is None:
        return []
    files = get_target(rec.target).metrics_files(get_target(rec.target).load_handle(rec.handle))
    out = []
    for i, task in enumerate(st.tasks):
        path = files[i] if i < len(files) else None
        curves, duration = read_run(path) if path else ({}, None)
        final = {k: pts[-1][1] for k, pts in curves.items()}
        best = {k: (min if _lower_is_better(k) else max)(v for _, v in pts) for k, pts in curves.items()}
        out.append(RunResult(index=task.index, values=dict(task.params), state=task.state.value, duration_s=duration,
                             final=final, best=best, curves=curves,
                             output_dir=os.path.dirname(path) if path else None))
    return out
