"""Job states, shared by every target. Each target maps its native states through one table."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the local supervisor imports this module on its quick start
    from collections.abc import Sequence
    from typing import Protocol

    class _Run(Protocol):
        """What ``summarize`` reads of a run (a ``TaskStatus``, the supervisor's namespace)."""

        @property
        def index(self) -> int: ...
        @property
        def state(self) -> JobState: ...
        @property
        def message(self) -> str: ...


class JobState(str, enum.Enum):
    """PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED; UNKNOWN when the target cannot tell."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, value: str) -> JobState:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


def combine(states: list[JobState]) -> JobState:
    """The state of a job made of several runs (sweep elements): any running -> RUNNING, ..."""
    if not states:
        return JobState.UNKNOWN
    if all(s == JobState.SUCCEEDED for s in states):
        return JobState.SUCCEEDED
    if any(s in (JobState.RUNNING,) for s in states):
        return JobState.RUNNING
    if any(s == JobState.PENDING for s in states):
        return JobState.RUNNING if any(s.terminal for s in states) else JobState.PENDING
    if any(s == JobState.UNKNOWN for s in states):
        return JobState.UNKNOWN
    if any(s == JobState.FAILED for s in states):
        return JobState.FAILED
    return JobState.CANCELLED


def summarize(tasks: Sequence[_Run]) -> tuple[JobState, str]:
    """The state and message of a job from its runs (``TaskStatus``, or anything with ``index``,
    ``state`` and ``message``): one run speaks for itself; a sweep gets counts per state and the
    first failure, e.g. ``2 succeeded, 1 failed; task 1: <cause>``."""
    state = combine([t.state for t in tasks])
    if len(tasks) == 1:
        return state, tasks[0].message
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.state.value] = counts.get(t.state.value, 0) + 1
    message = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    failed = next((t for t in tasks if t.state == JobState.FAILED), None)
    if failed is not None:
        message += f"; task {failed.index}: {failed.message}"
    return state, message
