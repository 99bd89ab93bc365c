"""What a target says of a job when asked (``Target.status``): ``JobStatus``, its runs (``TaskStatus``)
and their nodes (``NodeStatus``), typed; ``to_json`` is what ``status -o json`` shows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from launcher.core.jsondata import JSON, JSONObject, json_value
from launcher.core.states import JobState


@dataclass(frozen=True)
class NodeStatus:
    """One node of a run as ``status`` shows it: ``node``, its number (a pod's name where the pod's
    name does not say it), ``log`` where this machine has it, ``exit_code`` once it ended, and
    ``fields``: all its target says of it, in the target's order, as JSON (``status -o json``)."""

    node: int | str | None
    log: str | None = None
    exit_code: int | None = None
    fields: JSONObject = field(default_factory=dict)

    @classmethod
    def of(cls, row: Mapping[str, object]) -> NodeStatus:
        """A target's row for a node (its record, a pod's state) as the typed record (its values as JSON)."""
        node, log, code = row.get("node"), row.get("log"), row.get("exit_code")
        return cls(node if isinstance(node, (int, str)) and not isinstance(node, bool) else None,
                   log if isinstance(log, str) else None,
                   code if isinstance(code, int) and not isinstance(code, bool) else None,
                   {k: json_value(v) for k, v in row.items()})

    def details(self) -> list[tuple[str, JSON]]:
        """What a node's line shows after its number, in order: the fields but the node, its log and
        when it ended; a value not known yet (a running node's exit code) left out."""
        return [(k, v) for k, v in self.fields.items() if k not in ("node", "log", "ended") and v is not None]

    def to_json(self) -> dict[str, object]:
        return dict(self.fields)


@dataclass(frozen=True)
class Loss:
    """A node a run lost for good and how the run came back (the spec's ``recovery:``): made once where
    the target's records and the run's metrics file are read (``launcher.targets.shared.recovery``).

    ``at``: when ddpjob noticed it; ``how``: what was lost and how; ``reached_step``: the furthest step
    its ranks had reported; ``back_at``: when the run's nodes were started again (None: not brought
    back); ``nodes``: how many it went on with, ``replaced``: the lost one by a new process; from the program's metrics file, where it writes one:
    ``resumed_step`` (its resume event's step; 0 when it started again with no checkpoint),
    ``checkpoint_step`` and ``checkpoint_at`` (the step of the checkpoint it resumed from, as that run
    counted them, and when it was written; 0 and the first start's first step for none) and ``first_step_at`` (its first step after the way back)."""

    node: int | str
    at: float
    how: str
    reached_step: int | None = None
    back_at: float | None = None
    nodes: int | None = None
    replaced: bool = False  # the lost node's place taken by a new process (not a run gone on with fewer)
    resumed_step: int | None = None
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None
    first_step_at: float | None = None

    @property
    def lost_steps(self) -> int | None:
        """Steps trained again: from the checkpoint's step to the furthest one reached before the loss
        (both counted as the run counted them then, whatever world size it went on with)."""
        if self.reached_step is None or self.checkpoint_step is None:
            return None
        return max(0, self.reached_step - self.checkpoint_step)

    @property
    def lost_s(self) -> float | None:
        """Seconds lost: from the checkpoint it resumed from to its first step after the way back (the
        work redone and the time without training)."""
        if self.first_step_at is None or self.checkpoint_at is None:
            return None
        return max(0.0, self.first_step_at - self.checkpoint_at)

    def line(self) -> str:
        """``node 1 lost at 12:03:04 (its ...); back 1.2s later on 3 nodes; resumed at step 120: 14
        steps and 6.0s lost`` (each part where known)."""
        import time as clock

        from launcher.core.progress import duration

        text = f"node {self.node} lost at {clock.strftime('%H:%M:%S', clock.localtime(self.at))} ({self.how})"
        if self.back_at is None:
            return text + "; not brought back"
        text += f"; back {duration(self.back_at - self.at, tenths_below=60)} later"
        if self.nodes is not None:
            text += f" on {self.nodes} node(s)" + (f", node {self.node} replaced" if self.replaced else "")
        if self.resumed_step is not None:
            text += f"; resumed at step {self.resumed_step}" if self.resumed_step else "; started again from step 0 (no checkpoint yet)"
        lost = [f"{self.lost_steps} step(s)" if self.lost_steps is not None else "",
                f"{duration(self.lost_s, tenths_below=60)}" if self.lost_s is not None else ""]
        if any(lost):
            text += ": " + " and ".join(part for part in lost if part) + " lost"
        return text

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {k: v for k, v in vars(self).items() if v is not None}  # every field, known
        out.update(lost_steps=self.lost_steps, lost_s=None if self.lost_s is None else round(self.lost_s, 3))
        return out


@dataclass
class TaskStatus:
    """One run of a job (a sweep element, or the only run) and, where known, its nodes."""

    index: int
    state: JobState
    message: str = ""
    nodes: list[NodeStatus] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    native_id: str | None = None
    started: float | None = None  # when the run started and ended (seconds since the epoch), where the target records it
    ended: float | None = None
    losses: list[Loss] = field(default_factory=list)  # nodes it lost for good, and how it came back
    goodput: float | None = None  # the share of its wall time that went into training it kept (recovery.goodput)

    def losses_note(self) -> str:
        """``recovered: 1 lost node(s) brought back, goodput 93%``, or ``lost: 2 node(s), 1 brought back``
        ('' without losses). Both words lead a running job's line in ``list`` (``progress.HEALTH_NOTES``)."""
        if not self.losses:
            return ""
        back = sum(1 for loss in self.losses if loss.back_at is not None)
        if back == len(self.losses):
            text = f"recovered: {back} lost node(s) brought back"
        else:
            text = f"lost: {len(self.losses)} node(s), {back} brought back"
        return text + (f", goodput {100 * self.goodput:.0f}%" if self.goodput is not None else "")


@dataclass
class JobStatus:
    """What ``ddpjob status`` shows. ``message`` carries the root cause of a failure; ``started`` and
    ``ended``: when the job started and ended (seconds since the epoch) as the target's own record of the
    whole job says, where it keeps one (the local supervisor's ``state.json``); ``span`` tells them.
    ``source``: where the status comes from when the scheduler was not asked (``Target.recorded_status``)
    or which of its records said it (Slurm's squeue, sacct); None where the target does not say.
    ``details`` (JSON) are the rest a target says of the job (its run folder, port, namespace, ...);
    ``status -o json`` shows both in ``details``, ``source`` last (``shown_details``)."""

    state: JobState
    message: str = ""
    tasks: list[TaskStatus] = field(default_factory=list)
    details: JSONObject = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None
    source: str | None = None

    def shown_details(self) -> dict[str, object]:
        """``details`` with ``source`` last, as ``status`` shows them (and showed them when the target
        put ``source`` among its details)."""
        return {**self.details, "source": self.source} if self.source is not None else dict(self.details)

    def span(self) -> tuple[float | None, float | None]:
        """(started, ended) of the job as its target records them: its first run's start and, once it has
        ended, its last run's end (where every run that started says when it ended), so that a one-run
        job's duration is its run's (``results``); else the job's own; None where the target does not say.
        The registry keeps them (``Registry.note_state``): a job's end is when it ended, not when ddpjob
        first saw it ended."""
        starts = [t.started for t in self.tasks if t.started is not None]
        started = min(starts) if starts else self.started
        if not self.state.terminal:
            return started, None
        ran = [t for t in self.tasks if t.started is not None or t.ended is not None]
        ends = [t.ended for t in ran if t.ended is not None]
        return started, max(ends) if ends and len(ends) == len(ran) else self.ended

    def scrubbed(self, scrub: Callable[[str], str]) -> JobStatus:
        """This status with ``scrub`` applied to every text in it (messages, what each node says, the
        details): how ddpjob masks a job's secrets in what it read of the job (``JobRecord.scrub``)."""
        tasks = [dataclasses.replace(t, message=scrub(t.message), params=_texts(t.params, scrub),
                                     nodes=[dataclasses.replace(n, fields=_texts(n.fields, scrub)) for n in t.nodes])
                 for t in self.tasks]
        return dataclasses.replace(self, message=scrub(self.message), tasks=tasks, details=_texts(self.details, scrub),
                                   source=None if self.source is None else scrub(self.source))

    def to_json(self) -> dict[str, object]:
        started, ended = self.span()
        return {
            "state": self.state.value,
            "message": self.message,
            "started": started,
            "ended": ended,
            "details": self.shown_details(),
            "tasks": [
                {"index": t.index, "state": t.state.value, "message": t.message, "nodes": [n.to_json() for n in t.nodes],
                 "params": t.params, "native_id": t.native_id, "started": t.started, "ended": t.ended,
                 "losses": [loss.to_json() for loss in t.losses],
                 "goodput": None if t.goodput is None else round(t.goodput, 4)}
                for t in self.tasks
            ],
        }


_T = TypeVar("_T")


def _texts(data: _T, scrub: Callable[[str], str]) -> _T:
    """``data`` (JSON-like) with ``scrub`` applied to every string in it."""
    if isinstance(data, str):
        return scrub(data)  # type: ignore[return-value]
    if isinstance(data, dict):
        return {k: _texts(v, scrub) for k, v in data.items()}  # type: ignore[return-value]
    if isinstance(data, list):
        return [_texts(v, scrub) for v in data]  # type: ignore[return-value]
    return data
