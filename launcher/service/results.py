"""Each run's results, read back from its metrics file: ``ddpjob results``, ``ddpjob plot`` and the dashboard.

A run's metrics file is ``<output dir>/metrics.jsonl`` (``$DDPJOB_METRICS_FILE``): JSON lines that any
program may append, one object per line. A line counts when it has an integer ``step``; every other
key with a number (not a boolean) is a metric, except the bookkeeping keys in ``NOT_METRICS``::

    {"step": 120, "loss": 0.41, "samples_per_s": 2100.0, "time": 1764000000.5}
    {"step": 200, "eval_loss": 0.38, "eval_accuracy": 0.91}

A line may carry any subset of the metrics (the trainer writes training and evaluation lines apart).
Per run and metric: the **curve** is ``(step, value)`` in step order (a step written twice, as a run
resumed from a checkpoint does, keeps its later line); **final** is the value on the file's last line
that has the metric; **best** is the lowest value, or the highest for a metric whose name says that
higher is better (``higher_is_better``: accuracy, ``*_per_s``, ...), NaN and infinities left out.

Where the file is read: local runs write under ``$DDPJOB_HOME/runs/<id>/output/`` (or the spec's
``output_dir``), Slurm runs in the job folder (``<slurm.folder>/<id>/output/``, on the filesystem the
nodes share with the submitting machine); both come from the job's ``plan.json``. Kubernetes runs
write inside their pods (``/workspace/outputs/<id>/`` or the spec's ``output_dir``), which this machine
cannot read: their rows have states and sweep values but no metrics (``metrics_elsewhere``).

Pure standard library: the command line and the dashboard import this without any heavy library.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.core.errors import DdpjobError
from launcher.core.progress import METRICS_FILE

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs
    from launcher.service.registry import JobRecord
    from launcher.targets.jobstatus import JobStatus

# Numbers on a metrics line that are not metrics: where the line is, not how the run does.
NOT_METRICS = frozenset({"step", "time", "total_steps", "epoch", "world_size", "eval_samples",
                         "checkpoint_step", "checkpoint_world_size", "restart"})

# Words (split at anything but letters and digits) of a metric's name that make higher better.
_HIGHER_WORDS = frozenset({"acc", "accuracy", "auc", "auroc", "f1", "precision", "recall", "score", "iou", "map",
                           "bleu", "rouge", "top1", "top5", "throughput", "reward", "return"})


def metrics_elsewhere(target: str) -> str | None:
    """Why this machine cannot read the metrics files of a job of ``target`` (its target's
    ``metrics_elsewhere``: no row of such a job has metrics); None where it can."""
    from launcher.targets.lookup import get_target

    try:
        return get_target(target).metrics_elsewhere
    except DdpjobError:  # a target not installed here: its files are read as any other's
        return None


@dataclass(frozen=True)
class RunResult:
    """One run of a job (a sweep element, or the job's only run) and what its metrics file says.

    Attributes:
        index: the sweep index (0 for a job without sweep).
        values: this run's sweep values, typed as in the spec (``{}`` without sweep).
        state: the run's state as ``ddpjob status`` shows it (``SUCCEEDED``, ``RUNNING``, ...).
        duration_s: wall time from the run's start to its end as its target records them (to now while
            it runs: a run that has ended and whose end the target does not say is never timed to now);
            where it does not, from the metrics file's first to last ``time``; None if unknown.
        final: the last value of each metric.
        best: the best value of each metric (lowest; highest where ``higher_is_better``).
        curves: metric -> ``[(step, value)]`` in step order.
        output_dir: the run's output folder (None where unknown).
        lost_nodes: the nodes it lost for good (each brought back or not: ``ddpjob status`` tells how).
        goodput: the share of its wall time that went into training it kept, where a run lost nodes
            and its target tells it (``launcher.targets.shared.recovery``); None otherwise.
    """

    index: int
    values: dict[str, object]
    state: str
    duration_s: float | None
    final: dict[str, float]
    best: dict[str, float]
    curves: dict[str, list[tuple[int, float]]]
    output_dir: str | None
    lost_nodes: int = 0
    goodput: float | None = None


def higher_is_better(metric: str) -> bool:
    """``eval_accuracy``, ``samples_per_s``, ``f1``: yes; ``loss``, ``eval_loss``, ``step_time``: no."""
    name = metric.lower()
    return name.endswith(("_per_s", "_per_sec", "per_second")) or bool(_HIGHER_WORDS & set(re.split(r"[^a-z0-9]+", name)))


@dataclass
class Metrics:
    """What one metrics file says: curves, final values and the first and last ``time``."""

    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)
    first_time: float | None = None
    last_time: float | None = None

    @property
    def best(self) -> dict[str, float]:
        out = {}
        for name, points in self.curves.items():
            finite = [v for _, v in points if math.isfinite(v)]
            if finite:
                out[name] = max(finite) if higher_is_better(name) else min(finite)
        return out


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(path: str) -> Metrics:
    """The metrics in the file at ``path``; empty when it does not exist (yet) or cannot be read. Lines
    that are not JSON objects with an integer ``step`` (a line being written, a comment) are skipped."""
    by_step: dict[str, dict[int, float]] = {}
    out = Metrics()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; binary: a half-written UTF-8 character is no error
    except OSError:
        return out
    with f:
        for raw in f:
            try:
                rec = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            step = rec.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            when = rec.get("time")
            if isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when):
                out.first_time = when if out.first_time is None else out.first_time
                out.last_time = when
            for key, value in rec.items():
                if key in NOT_METRICS or not _number(value):
                    continue
                by_step.setdefault(key, {})[step] = float(value)
                out.final[key] = float(value)
    out.curves = {name: sorted(points.items()) for name, points in by_step.items()}
    return out


def job_results(jobs: Jobs, job_id: str) -> list[RunResult]:
    """One ``RunResult`` per run of the job ``job_id`` (a unique prefix is enough), in sweep order.

    The runs' states come from the target (as ``ddpjob status``); a target out of reach (Slurm's
    controller, the Kubernetes API) leaves the job's last recorded state on every run, and the metrics
    are read all the same. A job whose submission did not complete has no runs: ``[]``.

    Raises:
        JobNotFound: no such job.
    """
    rec = jobs.get(job_id)
    if rec.handle is None:
        return []
    status: JobStatus | None
    try:
        rec, status = jobs.refresh(rec.id)
    except DdpjobError:
        status = None
    runs = _runs(rec, status)
    sweep = rec.summary.sweep or {}
    out = []
    for run in runs:
        metrics = read_metrics(os.path.join(run.output_dir, METRICS_FILE)) if run.output_dir else Metrics()
        out.append(RunResult(
            index=run.index, values=_typed(run.params, sweep), state=run.state, duration_s=_duration(run, metrics),
            final=metrics.final, best=metrics.best, curves=metrics.curves, output_dir=run.output_dir,
            lost_nodes=run.lost_nodes, goodput=run.goodput))
    return out


@dataclass
class _Run:
    index: int
    params: dict[str, str]
    state: str
    output_dir: str | None
    started: float | None = None
    ended: float | None = None
    lost_nodes: int = 0
    goodput: float | None = None


def _runs(rec: JobRecord, status: JobStatus | None) -> list[_Run]:
    """The job's runs: from the status's tasks, else from the plan; output folders from the plan."""
    planned = _planned(rec)
    if status is not None and status.tasks:
        return [_Run(t.index, dict(t.params), t.state.value, planned[t.index].output_dir if t.index in planned else None,
                     t.started, t.ended, len(t.losses), t.goodput) for t in status.tasks]
    state = (status.state if status is not None else rec.state).value
    if planned:
        return [_Run(i, p.params, state, p.output_dir) for i, p in sorted(planned.items())]
    return [_Run(0, {}, state, None)]


def _planned(rec: JobRecord) -> dict[int, _Run]:
    """Each run's params and output folder from the job's ``plan.json`` (local, Slurm); none on Kubernetes,
    whose runs write in their pods."""
    if rec.handle is None or metrics_elsewhere(rec.target):
        return {}
    from launcher.targets.shared.planrecord import read_plan_record

    plan = read_plan_record(rec.files_dir)
    return {el.index: _Run(el.index, dict(el.params), "", el.output_dir)
            for el in (plan.elements if plan is not None else []) if el.index is not None}


def run_folders(rec: JobRecord) -> dict[int, str]:
    """Each run's output folder (``DDPJOB_OUTPUT_DIR``) by its index, from the job's plan; {} where this
    machine cannot read them (Kubernetes: in the pods)."""
    return {i: run.output_dir for i, run in _planned(rec).items() if run.output_dir}


def _typed(params: dict[str, str], sweep: dict[str, list[object]]) -> dict[str, object]:
    """A run's sweep values as the spec typed them (``0.1``, ``1``), matched by their text in the plan."""
    from launcher.spec.model import format_value

    out: dict[str, object] = {}
    for key, text in params.items():
        choices = sweep.get(key)
        out[key] = next((v for v in choices if format_value(v) == text), text) if isinstance(choices, list) else text
    return out


def _duration(run: _Run, metrics: Metrics) -> float | None:
    from launcher.core.states import JobState

    if run.started is not None and (run.ended is not None or not JobState.parse(run.state).terminal):
        end = run.ended if run.ended is not None else time.time()
        return max(0.0, end - run.started)
    if metrics.first_time is not None and metrics.last_time is not None:
        return max(0.0, metrics.last_time - metrics.first_time)
    return None


# The variable that tells a run where to resume from when its own output folder has no checkpoint yet
# (``ddpjob rerun --resume``; the reference trainer reads it: launcher/train/loop.py).
RESUME_FROM_ENV = "DDPJOB_RESUME_FROM"


def resume_from(rec: JobRecord) -> tuple[str | None, dict[int, int]]:
    """Where a rerun of ``rec`` resumes from: ``env.DDPJOB_RESUME_FROM``'s value (each new run gets the
    output folder of ``rec``'s run of the same index: ``.../sweep-{sweep_index}`` for a sweep), or None
    where this machine cannot name them (Kubernetes: the folders are in the pods); and the step of each
    run's newest checkpoint as its metrics file says (``{"event": "checkpoint", "step": N}``: the
    reference trainer's), by run index, for the runs that left one."""
    from launcher.targets.shared.recovery import read_events

    folders = run_folders(rec)
    if not folders:
        return None, {}
    steps = {}
    for index, folder in folders.items():
        saves = [e["step"] for e in read_events(os.path.join(folder, METRICS_FILE)) if e.get("event") == "checkpoint"]
        if saves:
            steps[index] = int(saves[-1])
    def literal(path: str) -> str:  # braces in a folder's name are no placeholders
        return path.replace("{", "{{").replace("}", "}}")

    if len(folders) == 1:
        return literal(next(iter(folders.values()))), steps
    root = folders[min(folders)].rsplit("/sweep-", 1)[0]
    if all(folder == f"{root}/sweep-{i}" for i, folder in folders.items()):
        return literal(root) + "/sweep-{sweep_index}", steps
    return None, steps
