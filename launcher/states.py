"""Job states, shared by every target. Each target maps its native states through one table."""

from __future__ import annotations

import enum


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
