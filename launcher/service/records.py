"""Typed records of what the registry keeps with a job and reads back: a job's row (``JobRecord``), the
submitted plan's shape (``JobShape``) and what ddpjob reads of the stored spec (``SpecSummary``). The
registry stores the last two as JSON; ``status -o json`` and ``list -o json`` show that JSON as it was."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from launcher.core.states import JobState
from launcher.core.tokens import Marks, scrub
from launcher.spec.secrets import mask_spec


@dataclass(frozen=True)
class JobShape:
    """``runs``, ``nodes`` and ``procs_per_node`` of a job (None where unknown)."""

    runs: int | None = None
    nodes: int | None = None
    procs_per_node: int | None = None

    @classmethod
    def from_json(cls, data: object) -> JobShape | None:
        """The shape the registry stored (``to_json``); None for nothing or something else."""
        if not isinstance(data, dict):
            return None
        return cls(*(_count(data.get(k)) for k in ("runs", "nodes", "procs_per_node")))

    def to_json(self) -> dict[str, int]:
        """As the registry stores it (and ``status -o json`` shows it): the known counts, keys sorted."""
        counts = {"nodes": self.nodes, "procs_per_node": self.procs_per_node, "runs": self.runs}
        return {k: v for k, v in counts.items() if v is not None}


@dataclass(frozen=True)
class SpecSummary:
    """What the service, ``status``, ``list`` and the dashboard read of the spec stored with a job
    (``JobRecord.spec``, the submitted spec as JSON, secret values masked); None where the stored
    spec does not say (a record from an older ddpjob)."""

    nodes: int | None = None
    procs_per_node: int | str | None = None  # a count, or "auto"
    sweep: dict[str, list[object]] | None = None
    image: str | None = None
    output_dir: str | None = None
    notify: bool = False

    @classmethod
    def from_json(cls, spec: dict[str, object]) -> SpecSummary:
        ppn = spec.get("procs_per_node")
        sweep = spec.get("sweep") or {}
        image, output_dir = spec.get("image"), spec.get("output_dir")
        return cls(
            nodes=_count(spec.get("nodes")),
            procs_per_node=ppn if isinstance(ppn, str) else _count(ppn),
            sweep={str(k): list(v) for k, v in sweep.items() if isinstance(v, list)} if isinstance(sweep, dict) else None,
            image=image if isinstance(image, str) else None,
            output_dir=output_dir if isinstance(output_dir, str) else None,
            notify=bool(spec.get("notify")),
        )


@dataclass(frozen=True)
class JobRecord:
    """One row of the registry (``launcher.service.registry``)."""

    id: str
    name: str
    target: str
    state: JobState
    spec: dict[str, object]  # the submitted spec as JSON (secret values masked); ``summary`` reads it
    handle: dict[str, object] | None
    run_dir: str
    port: int | None
    message: str
    created_at: float
    updated_at: float
    ended_at: float | None  # when the job ended as its target records it; where it does not say, when ddpjob saw it
    shape: JobShape | None = None  # runs, nodes, procs_per_node of the submitted plan
    # Where the spec came from (``launcher.service.origin``): working directory, spec file, which
    # secret values came from where (names only), and the job a rerun came from.
    origin: dict[str, object] | None = None
    started_at: float | None = None  # when the job started as its target records it (None: it does not say)

    def duration_s(self, now: float | None = None) -> float:
        """Seconds from its start (its submit where the target does not say) to its end (to ``now``, or
        now, while it runs): what ``list``, ``status`` and the dashboard show, and for a one-run job
        what ``results`` shows of its run."""
        return max(0.0, (self.ended_at or now or time.time()) - (self.started_at or self.created_at))

    @property
    def files_dir(self) -> str:
        """The job's run folder as its target's handle names it (every ``Handle`` has a ``run_dir``; Slurm's
        and k8s' may be elsewhere than ddpjob's own), else the registry's ``run_dir``: where ``plan.json``
        is read (``launcher.targets.shared.planrecord``)."""
        return self._handle_text("run_dir") or self.run_dir

    @property
    def job_dir(self) -> str | None:
        """The job's folder its handle names besides the run folder (Slurm's job folder), if any."""
        return self._handle_text("job_dir")

    def _handle_text(self, key: str) -> str | None:
        """A text field of the handle as the registry keeps it (JSON: the target's ``Handle.to_json``)."""
        value = (self.handle or {}).get(key)
        return value if isinstance(value, str) and value else None

    @functools.cached_property
    def marks(self) -> Marks | None:
        """The salted hashes of the job's secret values (``launcher.core.tokens.Marks``), if it had any."""
        return Marks.from_json((self.origin or {}).get("marks"))

    def scrub(self, text: str) -> str:
        """``text`` from the job as ddpjob shows it: its secret values and credentials masked."""
        return scrub(text, self.marks)

    @property
    def summary(self) -> SpecSummary:
        """What ddpjob reads of the stored spec (nodes, sweep, notify, ...), typed."""
        return SpecSummary.from_json(self.spec)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "name": self.name, "target": self.target, "state": self.state.value,
            "message": self.message, "run_dir": self.run_dir, "port": self.port,
            "created_at": self.created_at, "updated_at": self.updated_at, "started_at": self.started_at,
            "ended_at": self.ended_at, "duration_s": round(self.duration_s(), 3),
            "handle": self.handle, "spec": mask_spec(self.spec), "shape": self.shape.to_json() if self.shape else None,
            "origin": {k: v for k, v in self.origin.items() if k != "marks"} if self.origin else None,
            "rerun_of": (self.origin or {}).get("rerun_of"),
        }


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
