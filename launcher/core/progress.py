"""How far a run is, from its metrics file (``$DDPJOB_METRICS_FILE``).

ddpjob gives every run ``DDPJOB_METRICS_FILE`` (``<output dir>/metrics.jsonl``). Any program may
append JSON lines to it; the reference trainer does. A line counts when it has an integer
``step``; these keys are read when present::

    {"step": 120, "total_steps": 300, "loss": 0.41, "samples_per_s": 2100.0, "time": 1764000000.5}

``time`` (seconds since the epoch) dates the line; without it the file's modification time dates
the last one. ``status``, ``list`` and ``wait`` show step/total, the last loss, the throughput, an
ETA from the steps per second between the first and the last line, and the last window's step split
(``data_ms``, ``compute_ms``, ``comm_ms``: ``launcher.core.stepsplit``). Only the file's first and
last 64 KiB are read, so a long run costs no more than a short one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.core.jsondata import JSONObject
    from launcher.core.stepsplit import StepSplit

METRICS_FILE = "metrics.jsonl"
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Progress:
    """How far a run is: its last ``step`` and what else its metrics say (None: not said), ``updated``
    (when the last line was written), ``eta_s`` where the rate is known, and ``task``: which run of a
    sweep it is (None for a job of one run). ``to_json`` is what ``status``/``list -o json`` show."""

    step: int
    updated: float
    total_steps: int | float | None = None  # numbers as the metrics line wrote them (an int stays an int)
    loss: float | None = None
    samples_per_s: float | None = None
    data_ms: float | None = None  # the step split (launcher.core.stepsplit) of the last window that has one
    compute_ms: float | None = None
    comm_ms: float | None = None
    peak_memory_mb: float | None = None
    eta_s: float | None = None
    task: int | None = None

    def of_task(self, index: int) -> Progress:
        return dataclasses.replace(self, task=index)

    def to_json(self) -> dict[str, float]:
        out: dict[str, float] = {"step": self.step}
        for key in ("total_steps", "loss", "samples_per_s", "data_ms", "compute_ms", "comm_ms", "peak_memory_mb"):
            if (value := getattr(self, key)) is not None:
                out[key] = value
        out["updated"] = self.updated
        if self.eta_s is not None:
            out["eta_s"] = self.eta_s
        if self.task is not None:
            out["task"] = self.task
        return out

    def split(self) -> StepSplit | None:
        """The step split (``launcher.core.stepsplit``), or None without one."""
        from launcher.core.stepsplit import StepSplit

        return StepSplit.of(self.to_json())


def metrics_path(output_dir: str) -> str:
    return f"{output_dir.rstrip('/')}/{METRICS_FILE}"


def _records(data: bytes) -> list[JSONObject]:
    out: list[JSONObject] = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by the chunk boundary, or not JSON
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and not isinstance(rec.get("step"), bool):
            out.append(rec)
    return out


def read_progress(path: str) -> Progress | None:
    """What the metrics file at ``path`` says of the run, or None when it does not exist or has no step yet."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(min(size, _CHUNK))
            if size > _CHUNK:
                f.seek(size - _CHUNK)
            tail = f.read() if size > _CHUNK else head
            mtime = os.fstat(f.fileno()).st_mtime
    except OSError:
        return None
    return _progress(_records(head), _records(tail), mtime)


# A line a program prints to say how far it is where ddpjob cannot read its metrics file (in a
# Kubernetes pod): ``DDPJOB_PROGRESS {"step": 120, "total_steps": 300, "loss": 0.41}``. The
# reference trainer prints it when DDPJOB_PROGRESS_LINES=1, which ddpjob sets in pods.
PROGRESS_MARK = "DDPJOB_PROGRESS "


def progress_from_lines(lines: list[str], now: float) -> Progress | None:
    """Progress from the ``DDPJOB_PROGRESS`` lines among ``lines`` (a log's tail, any prefixes);
    ``now`` dates the last record when it has no ``time``."""
    found = [line[line.index(PROGRESS_MARK) + len(PROGRESS_MARK):] for line in lines if PROGRESS_MARK in line]
    records = _records("\n".join(found).encode())
    return _progress(records, records, now)


def _progress(head: list[JSONObject], last_records: list[JSONObject], mtime: float) -> Progress | None:
    if not last_records:
        return None
    first, last = (head or last_records)[0], last_records[-1]
    step, first_step = _step(last), _step(first)
    said: dict[str, float] = {}  # numbers as the lines wrote them (an int stays an int)
    for key in ("total_steps", "loss", "samples_per_s"):
        value = next((v for r in reversed(last_records) if isinstance(v := r.get(key), (int, float))), None)
        if value is not None:
            said[key] = value
    # The step split (launcher.core.stepsplit) of the last window that has one, all keys from one line.
    from launcher.core.stepsplit import MEMORY_KEY, SPLIT_KEYS, is_number

    split_line = next((r for r in reversed(last_records) if all(k in r for k in SPLIT_KEYS)), None)
    if split_line is not None:
        said.update({k: v for k in (*SPLIT_KEYS, MEMORY_KEY)
                     if isinstance(v := split_line.get(k), (int, float)) and is_number(v)})
    last_time = last.get("time")
    updated: float = last_time if isinstance(last_time, (int, float)) else mtime
    total: object = said.get("total_steps")  # an int when the line wrote one
    t0 = first.get("time")
    eta_s = None
    if isinstance(total, int) and isinstance(t0, (int, float)) and updated > t0 and step > first_step:
        per_step = (updated - t0) / (step - first_step)
        eta_s = round(max(0, total - step) * per_step, 1)
    return Progress(step=step, updated=updated, total_steps=said.get("total_steps"), loss=said.get("loss"),
                    samples_per_s=said.get("samples_per_s"), data_ms=said.get("data_ms"),
                    compute_ms=said.get("compute_ms"), comm_ms=said.get("comm_ms"),
                    peak_memory_mb=said.get("peak_memory_mb"), eta_s=eta_s)


def _step(record: JSONObject) -> int:
    step = record["step"]  # an int: _records keeps no other line
    return step if isinstance(step, int) else 0


def describe(progress: Progress | None) -> str:
    """``step 120/300, loss 0.4100, 2100 samples/s, ETA 1m20s`` ('' without progress)."""
    if not progress:
        return ""
    total = progress.total_steps
    parts = [f"step {progress.step}" + (f"/{total}" if total else "")]
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    if progress.samples_per_s is not None:
        parts.append(f"{progress.samples_per_s:.0f} samples/s")
    if progress.eta_s is not None:
        parts.append(f"ETA {duration(progress.eta_s)}")
    split = progress.split()
    if split is not None:
        parts.append(f"step: {split.text()}")
    return ", ".join(parts)


# What the stall watch adds to a running job's message, and what a run that lost nodes says
# (launcher.targets.jobstatus.TaskStatus.losses_note).
HEALTH_NOTES = ("stalled:", "straggler:", "recovered:", "lost:")


def with_health(text: str, message: str | None) -> str:
    """A progress line with what the stall watch says of the job's ranks (a stuck rank, a straggler:
    ``launcher.targets.shared.heartbeat.report``), which a line of steps alone would hide: first, so
    that a line cut short (``list``) keeps it."""
    if message and message.startswith(HEALTH_NOTES):
        return f"{message}; {text}" if text else message
    return text


def advice(progress: Progress | None) -> str | None:
    """The step split's advice (``StepSplit.advice``) for a run's progress, or None."""
    split = progress.split() if progress else None
    return split.advice() if split is not None else None


def duration(seconds: float, *, tenths_below: float = 0.0) -> str:
    """A duration in a column or a line: ``4.8s`` (under ``tenths_below`` seconds), ``42s``,
    ``3m05s``, ``2h04m``, ``3d07h``. Every command and the dashboard write durations this way."""
    if seconds < tenths_below:
        return f"{max(0.0, seconds):.1f}s"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
