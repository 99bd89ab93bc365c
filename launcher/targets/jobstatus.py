"""What a target says of a job when asked (``Target.status``): ``JobStatus``, its runs (``TaskStatus``)
and their nodes (``NodeStatus``), typed; ``to_json`` is what ``status -o json`` shows."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.core.states import JobState


@dataclass(frozen=True)
class NodeStatus:
    """One node of a run as ``status`` shows it: ``node``, its number (a pod's name where the pod's
    name does not say it), ``log`` where this machine has it, ``exit_code`` once it ended, and
    ``fields``: all its target says of it, in the target's order, as JSON (``status -o json``)."""

    node: int | str | None
    log: str | None = None
    exit_code: int | None = None
    fields: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, row: dict[str, object]) -> NodeStatus:
        """A target's row for a node (its record, a pod's state) as the typed record."""
        node, log, code = row.get("node"), row.get("log"), row.get("exit_code")
        return cls(node if isinstance(node, (int, str)) and not isinstance(node, bool) else None,
                   log if isinstance(log, str) else None,
                   code if isinstance(code, int) and not isinstance(code, bool) else None, dict(row))

    def details(self) -> list[tuple[str, object]]:
        """What a node's line shows after its number, in order: the fields but the node, its log and
        when it ended; a value not known yet (a running node's exit code) left out."""
        return [(k, v) for k, v in self.fields.items() if k not in ("node", "log", "ended") and v is not None]

    def to_json(self) -> dict[str, object]:
        return dict(self.fields)


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


@dataclass
class JobStatus:
    """What ``ddpjob status`` shows. ``message`` carries the root cause of a failure."""

    state: JobState
    message: str = ""
    tasks: list[TaskStatus] = field(default_factory=list)
    details: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "message": self.message,
            "details": self.details,
            "tasks": [
                {"index": t.index, "state": t.state.value, "message": t.message, "nodes": [n.to_json() for n in t.nodes],
                 "params": t.params, "native_id": t.native_id}
                for t in self.tasks
            ],
        }
