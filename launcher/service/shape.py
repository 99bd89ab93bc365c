"""The shape of a submitted job (runs, nodes, processes per node) and the checks made against it.

``logs --node/--rank/--task`` and ``cancel --task`` outside the job are command-line mistakes
(exit 2, with the valid range), found before any target is asked. The shape is the submitted
plan's, recorded with the handle; for records older than that it is read from the stored spec
(``procs_per_node: auto`` then leaves the ranks unchecked).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeVar

from launcher.core.errors import UsageError
from launcher.core.fields import COUNT_MAX
from launcher.service.records import JobShape

if TYPE_CHECKING:
    from launcher.service.registry import JobRecord
    from launcher.targets.base import Plan


PayloadT = TypeVar("PayloadT")


def plan_shape(plan: Plan[PayloadT]) -> JobShape:
    """What the registry records of a submitted plan."""
    return JobShape(runs=plan.runs, nodes=plan.nodes, procs_per_node=plan.procs_per_node)


def shape_of(rec: JobRecord) -> JobShape:
    """``runs``, ``nodes`` and ``procs_per_node`` of a job: the submitted plan's, else the stored spec's
    (``procs_per_node: auto`` then unknown)."""
    if rec.shape is not None:
        return rec.shape
    spec = rec.summary
    return JobShape(
        runs=math.prod(len(v) for v in spec.sweep.values()) if spec.sweep is not None else None,
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node if isinstance(spec.procs_per_node, int) else None,
    )


def check_selection(rec: JobRecord, *, task: int | None = None, node: int | None = None,
                    rank: int | None = None) -> None:
    """Refuse a task, node or rank the job does not have (``UsageError``, with the valid range)."""
    shape = shape_of(rec)
    ranks = shape.nodes * shape.procs_per_node if shape.nodes and shape.procs_per_node else None
    for option, value, count, what in (("--task", task, shape.runs, "run"), ("--node", node, shape.nodes, "node"),
                                       ("--rank", rank, ranks, "rank")):
        if value is None:
            continue
        if value < 0:
            raise UsageError(f"{option} {value}: must be 0 or more")
        if count is not None and value >= count:
            raise UsageError(f"{option} {value}: {rec.id} has {count} {what}{'' if count == 1 else 's'} "
                             f"(valid: 0..{count - 1})")


def check_timeout(timeout: float | None) -> None:
    """A ``wait`` timeout must be a finite number of seconds, 0 or more (``nan`` never expires)."""
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise UsageError(f"--timeout {timeout}: give a number of seconds, 0 or more (e.g. --timeout 600)")


def check_count(option: str, value: int | None) -> None:
    """A count of lines or jobs (``--tail``, ``--limit``): a whole number from 0 to ``COUNT_MAX``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{option} {value!r}: give a whole number of 0 or more")
    if not 0 <= value <= COUNT_MAX:
        shown = f"{value}" if value.bit_length() < 64 else "a number that large"
        raise UsageError(f"{option} {shown}: give a whole number from 0 to {COUNT_MAX:,}")
