"""``state.json`` as a typed record (issue 46 item 1): what the local supervisor keeps of its job and
``status``, ``cancel`` and the cgroup clean-up read back. Its one reader is ``read_state`` (``parse``), its
one writer ``write_state`` (``to_json``: the supervisor through ``statefile.StateFile``, which keeps it
when the disk is full; ``cancel`` when the supervisor is gone).

The names on disk are those of every version so far::

    {"version": 1, "state": "RUNNING", "message": "", "port": 29500, "supervisor_pid": 123,
     "started": 1.7e9, "ended": null, "cgroup": "/sys/fs/cgroup/.../ddpjob-<id>", "cgroup_unavailable": null,
     "left_behind": "...",  (only once something was)
     "elements": [{"index": 0, "params": {}, "state": "RUNNING", "message": "", "output_dir": "...",
                   "started": 1.7e9, "ended": 1.7e9, "restarts": 1, "losses": [...], "recovery_note": "...",
                   "nodes": [{"node": 0, "pid": 124, "exit_code": null, "log": ".../node-0.log", "error": "..."}]}]}

``version``: absent in the files of ddpjob before this record (0; the same layout), 1 since. A key
missing, or of another type, reads as the default the readers gave it before; a node's keys this record
does not know are kept (``status`` shows every field of a node). ``losses`` are the loss records of
``recover.py`` as ``shared/recovery.py`` reads them (Slurm's ``recovery.json`` holds the same).

Standard library only and no dataclasses: the supervisor runs as ``python -I -S`` and imports it on its
quick way to the first nodes (``supervisor.py``).
"""

from __future__ import annotations

import os

STATE_VERSION = 1


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class StateNode:
    """One node of a run as the supervisor started it: its number, its wrapper's pid, how it exited
    (None while it runs), its log, and its own error where it failed the same way as another."""

    __slots__ = ("error", "exit_code", "extra", "log", "node", "pid")

    def __init__(self, node: int, pid: int | None, log: str, exit_code: int | None = None,
                 error: str | None = None, extra: dict[str, object] | None = None) -> None:
        self.node, self.pid, self.exit_code, self.log, self.error = node, pid, exit_code, log, error
        self.extra = extra or {}

    def to_json(self) -> dict[str, object]:
        """On disk, and the row ``status`` shows (``NodeStatus.of``): its keys in order, as read back."""
        out: dict[str, object] = {**self.extra, "node": self.node, "pid": self.pid, "exit_code": self.exit_code,
                                  "log": self.log}
        if self.error is not None:
            out["error"] = self.error
        return dict(sorted(out.items()))


class StateElement:
    """One run (a sweep element): its state and message, when it started and ended, its nodes, and
    the nodes it lost for good and how often it started again (``recover.py``)."""

    __slots__ = (
        "ended",
        "index",
        "losses",
        "message",
        "nodes",
        "output_dir",
        "params",
        "recovery_note",
        "restarts",
        "started",
        "state",
    )

    def __init__(self, index: int, params: dict[str, str], state: str, message: str = "",
                 output_dir: str | None = None) -> None:
        self.index, self.params, self.state, self.message, self.output_dir = index, params, state, message, output_dir
        self.nodes: list[StateNode] = []
        self.started: float | None = None
        self.ended: float | None = None
        self.restarts = 0
        self.losses: list[dict[str, object]] | None = None  # None: it never lost one (the key absent on disk)
        self.recovery_note: str | None = None  # why a loss was not brought back, until the message says it

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index, "params": self.params, "state": self.state,
                                  "message": self.message, "output_dir": self.output_dir,
                                  "nodes": [n.to_json() for n in self.nodes]}
        known = {"started": self.started, "ended": self.ended, "losses": self.losses,
                 "recovery_note": self.recovery_note, "restarts": self.restarts or None}
        return out | {key: value for key, value in known.items() if value is not None}  # each where known


class StateRecord:
    """The supervisor's state of the whole job."""

    __slots__ = (
        "cgroup",
        "cgroup_unavailable",
        "elements",
        "ended",
        "left_behind",
        "message",
        "port",
        "started",
        "state",
        "supervisor_pid",
        "version",
    )

    def __init__(self, state: str, message: str = "", *, port: int | None = None, supervisor_pid: int | None = None,
                 started: float | None = None, cgroup: str | None = None, cgroup_unavailable: str | None = None,
                 elements: list[StateElement] | None = None, version: int = STATE_VERSION) -> None:
        self.version, self.state, self.message, self.port = version, state, message, port
        self.supervisor_pid, self.started = supervisor_pid, started
        self.ended: float | None = None
        self.cgroup, self.cgroup_unavailable = cgroup, cgroup_unavailable
        self.left_behind: str | None = None
        self.elements = elements if elements is not None else []

    @property
    def terminal(self) -> bool:
        """The job has ended (its final state is written)."""
        from launcher.core.states import JobState

        return JobState.parse(self.state).terminal

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "version": STATE_VERSION, "state": self.state, "message": self.message, "port": self.port,
            "supervisor_pid": self.supervisor_pid, "started": self.started, "ended": self.ended,
            "cgroup": self.cgroup, "cgroup_unavailable": self.cgroup_unavailable,
            "elements": [el.to_json() for el in self.elements]}
        if self.left_behind is not None:
            out["left_behind"] = self.left_behind
        return out


def _node(data: dict[str, object]) -> StateNode:
    node, log = _int(data.get("node")), _text(data.get("log"))
    extra = {k: v for k, v in data.items() if k not in ("node", "pid", "exit_code", "log", "error")}
    return StateNode(node if node is not None else 0, _int(data.get("pid")), log or "", _int(data.get("exit_code")),
                     _text(data.get("error")), extra)


def _element(data: dict[str, object], position: int) -> StateElement:
    index, params, nodes, losses = _int(data.get("index")), data.get("params"), data.get("nodes"), data.get("losses")
    el = StateElement(index if index is not None else position,
                      {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {},
                      _text(data.get("state")) or "UNKNOWN", _text(data.get("message")) or "",
                      _text(data.get("output_dir")))
    el.nodes = [_node(n) for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []
    el.started, el.ended = _num(data.get("started")), _num(data.get("ended"))
    el.restarts = _int(data.get("restarts")) or 0
    el.losses = [x for x in losses if isinstance(x, dict)] if isinstance(losses, list) else None
    el.recovery_note = _text(data.get("recovery_note"))
    return el


def parse_state(data: object) -> StateRecord | None:
    """``state.json``'s data as the record; None when it is not a mapping (not a state)."""
    if not isinstance(data, dict):
        return None
    elements = data.get("elements")
    rec = StateRecord(_text(data.get("state")) or "UNKNOWN", _text(data.get("message")) or "",
                      port=_int(data.get("port")), supervisor_pid=_int(data.get("supervisor_pid")),
                      started=_num(data.get("started")), cgroup=_text(data.get("cgroup")),
                      cgroup_unavailable=_text(data.get("cgroup_unavailable")),
                      elements=[_element(el, i) for i, el in enumerate(elements) if isinstance(el, dict)]
                      if isinstance(elements, list) else [],
                      version=_int(data.get("version")) or 0)
    rec.ended, rec.left_behind = _num(data.get("ended")), _text(data.get("left_behind"))
    return rec


def read_state(run_dir: str | os.PathLike[str]) -> StateRecord | None:
    """``state.json`` of the job in ``run_dir`` as the supervisor last wrote it; None before its first write."""
    from launcher.targets.shared.runfolder import RunFolder

    return parse_state(RunFolder(run_dir).read_state())


def write_state(path: str, record: StateRecord) -> None:
    """``record`` to the state file ``path`` (``RunFolder.state``), atomically; OSError when the disk refuses it."""
    from launcher.targets.shared.files import write_json

    write_json(path, record.to_json())
