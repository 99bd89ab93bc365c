"""Typed records of what the registry keeps with a job and reads back: the submitted plan's shape
(``JobShape``) and what ddpjob reads of the stored spec (``SpecSummary``). The registry stores them as
JSON; ``status -o json`` and ``list -o json`` show that JSON as it was."""

from __future__ import annotations

from dataclasses import dataclass


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


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
