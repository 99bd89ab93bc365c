"""When to checkpoint by time, so that a lost node costs minutes of work at most, whatever the step time.

``--checkpoint-seconds auto`` (the default) checkpoints as often as it costs at most ``AUTO_SHARE``
of the training time, measured on the last checkpoint taken, but never more than ``AUTO_MAX_S``
apart and never less than ``AUTO_MIN_S``: a small model (a checkpoint in milliseconds) is saved every
10 s, one whose checkpoint takes 30 s every 25 minutes would be, and is saved every 10 minutes. A
number is a fixed interval; 0 turns timed checkpoints off (epoch ends and ``--checkpoint-every`` stay).

Every rank keeps its own clock and the ranks agree when a checkpoint is due in the all-reduce that
already carries their stop agreement (``preempt.StopAgreement``): no collective of its own, and all
ranks save at the same step.
"""

from __future__ import annotations

import time

AUTO_SHARE = 0.02
AUTO_MIN_S = 10.0
AUTO_MAX_S = 600.0


class CheckpointClock:
    """Whether a timed checkpoint is due; ``taken`` after each checkpoint of any kind resets it."""

    def __init__(self, seconds: float | None) -> None:
        self.fixed = seconds  # None: auto
        self.last = time.monotonic()
        self.cost: float | None = None  # the last checkpoint's wall time

    def interval(self) -> float | None:
        """Seconds between timed checkpoints now; None when they are off."""
        if self.fixed is not None:
            return self.fixed or None
        if self.cost is None:
            return AUTO_MIN_S
        return min(AUTO_MAX_S, max(AUTO_MIN_S, self.cost / AUTO_SHARE))

    def due(self) -> bool:
        interval = self.interval()
        return interval is not None and time.monotonic() - self.last >= interval

    def taken(self, cost: float) -> None:
        self.last = time.monotonic()
        self.cost = cost


def parse_seconds(text: str) -> float | None:
    """``--checkpoint-seconds``: ``auto`` (None) or seconds >= 0; ValueError otherwise."""
    if text.strip().lower() == "auto":
        return None
    value = float(text)
    if not 0 <= value <= 7 * 86400:  # nan fails both
        raise ValueError(text)
    return value
