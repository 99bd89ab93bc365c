"""A run's lost nodes and its goodput, told from the target's records of each loss and the run's metrics
file: the typed ``jobstatus.Loss`` that ``status``, ``list``, ``wait``, ``results`` and the dashboard read.

A target records each loss as a mapping (local: ``state.json``'s ``losses``, written by the
supervisor: ``node``, ``at``, ``how``, ``reached_step``, ``back_at``, ``nodes``, ``replaced``). The
program says where it resumed in its metrics file (``$DDPJOB_METRICS_FILE``; the reference trainer
writes ``{"event": "resume", "step": ..., "checkpoint_step": ...}`` and its checkpoints as
``{"event": "checkpoint", "step": ...}``, each with its ``time``). A program that writes none still has
its losses told, without the steps and seconds they cost.

*Goodput* is the share of a run's wall time that went into training it kept: from its start to its end
(or now), less the wait for its first step and, for each loss, the time from the checkpoint it resumed
from to its first step after the way back (the work redone and the time without training).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, TypedDict, TypeGuard, cast

from launcher.targets.jobstatus import JobStatus, Loss

if TYPE_CHECKING:
    from launcher.core.jsondata import JSON


class _Stepped(TypedDict):
    step: int
    time: float


class Event(_Stepped, total=False):
    """A line of the metrics file that ``events`` keeps: an integer ``step`` and a number ``time``; the
    rest as the program wrote it (``event``: "step" when missing, "resume" or "checkpoint";
    ``checkpoint_step``: a resume's)."""

    event: JSON
    checkpoint_step: JSON

# The metrics file is read (once) only for a run that lost a node, and at most its last this many bytes.
MAX_READ = 32 * 2**20


def told(rows: object, metrics_file: str | None, *, started: float | None, ended: float | None,
         now: float) -> tuple[list[Loss], float | None]:
    """A run's losses and its goodput, the metrics file read once: ``rows`` are the target's records of
    its losses (a list of mappings; anything else in it is left out), ``started``/``ended`` the run's
    (``ended`` None while it runs: up to ``now``). Goodput is None where it cannot be told (see
    ``goodput``)."""
    events = read_events(metrics_file) if metrics_file else []
    found = losses(rows, events)
    return found, goodput(started, ended, found, events, now)


def losses(rows: object, events: list[Event]) -> list[Loss]:
    """The records of a run's losses as ``Loss``es, what the metrics file's ``events`` (``read_events``)
    say of each added. Rows that are not such records are left out."""
    if not isinstance(rows, list):
        return []
    found = [loss for row in rows if (loss := _loss(row)) is not None]
    if not events:
        return found
    return [_with_metrics(loss, events, found[i + 1].at if i + 1 < len(found) else None)
            for i, loss in enumerate(found)]


def _loss(row: object) -> Loss | None:
    if not isinstance(row, dict):
        return None
    node, at, how = row.get("node"), _number(row.get("at")), row.get("how")
    if not isinstance(node, (int, str)) or isinstance(node, bool) or at is None or not isinstance(how, str):
        return None
    reached, nodes = row.get("reached_step"), row.get("nodes")
    return Loss(node, at, how, reached if _int(reached) else None, _number(row.get("back_at")),
                nodes if _int(nodes) else None, row.get("replaced") is True)


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_events(path: str) -> list[Event]:
    """The metrics file's lines that have an integer ``step`` and a ``time``, in order (its last
    ``MAX_READ`` bytes)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_READ:
                f.seek(size - MAX_READ)
            data = f.read()
    except OSError:
        return []
    rows: list[JSON] = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return events(rows)


def events(rows: object) -> list[Event]:
    """The rows that are metrics events (a mapping with an integer ``step`` and a ``time``), in order;
    ``[]`` for anything that is not a list of rows (a record read from a pod's ``watch.json``)."""
    if not isinstance(rows, list):
        return []
    # An ``Event`` once its ``step`` and ``time`` are checked: the rest is read with ``.get`` and narrowed.
    return [cast(Event, r) for r in rows
            if isinstance(r, dict) and _int(r.get("step")) and _number(r.get("time")) is not None]


def _with_metrics(loss: Loss, events: list[Event], next_loss: float | None) -> Loss:
    """``loss`` with where the program resumed after it: its first resume event after the run was back
    (before the next loss); with none, a first step of 1 means it started again from the beginning."""
    if loss.back_at is None:
        return loss
    after = [e for e in events if e["time"] >= loss.back_at and (next_loss is None or e["time"] < next_loss)]
    before = [e for e in events if e["time"] < loss.at]
    steps_before = [e for e in before if e.get("event", "step") == "step"]
    reached = max([loss.reached_step or 0, *(e["step"] for e in steps_before)]) or loss.reached_step
    resume = next((e for e in after if e.get("event") == "resume"), None)
    first = next((e for e in after if e.get("event", "step") == "step" and (resume is None or e["time"] >= resume["time"])), None)
    if resume is not None:
        saved = resume.get("checkpoint_step", resume["step"])
        saved = saved if _int(saved) else resume["step"]
        # Before the run came back, not before the loss: rank 0 may finish a checkpoint while a lost peer's
        # end is being noticed, and the run then resumes from it.
        saves = [e for e in events if e.get("event") == "checkpoint" and e["step"] == saved and e["time"] < loss.back_at]
        resumed, checkpoint_at = int(resume["step"]), _number(saves[-1]["time"]) if saves else None
    elif first is not None and first["step"] <= 1:  # started again from the beginning: no checkpoint yet
        resumed = saved = 0
        checkpoint_at = _number(steps_before[0]["time"]) if steps_before else None
    else:
        return Loss(**{**vars(loss), "reached_step": reached})
    return Loss(**{**vars(loss), "reached_step": reached, "resumed_step": resumed, "checkpoint_step": saved,
                   "checkpoint_at": checkpoint_at, "first_step_at": _number(first["time"]) if first else None})


def goodput(started: float | None, ended: float | None, run_losses: list[Loss], events: list[Event],
            now: float) -> float | None:
    """The run's goodput (see the module's docstring) from its metrics file's ``events``, or None where
    it cannot be told: no start, no first step in the file, or a loss whose cost is not known."""
    if started is None or any(loss.back_at is not None and loss.lost_s is None for loss in run_losses):
        return None
    # (A metrics file may hold an earlier run's lines: an output folder used again.)
    first = next((e for e in events if e.get("event", "step") == "step" and e["time"] >= started - 1), None)
    end = ended if ended is not None else now
    wall = end - started
    if first is None or wall <= 0:
        return None
    kept = wall - max(0.0, float(first["time"]) - started) - sum(loss.lost_s or 0.0 for loss in run_losses)
    return max(0.0, min(1.0, kept / wall))


def with_losses(status: JobStatus) -> JobStatus:
    """A job's message says that its runs lost nodes and came back (``TaskStatus.losses_note``), after
    what it says already."""
    notes = [(t.index, note) for t in status.tasks if (note := t.losses_note())]
    if notes:
        told = notes[0][1] if len(status.tasks) == 1 else "; ".join(f"task {i}: {note}" for i, note in notes)
        status.message = f"{status.message.rstrip('.')}; {told}" if status.message else told
    return status
