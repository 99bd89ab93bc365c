"""The spec's ``stall:`` section: when a node that goes silent is noticed, and what then happens.

Read by the targets that watch their nodes and ranks (every target: heartbeats between the nodes of
each run, with each rank's vitals, see ``launcher.targets.shared.heartbeat``). Kept apart from ``model.py`` so that module stays small.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from launcher.core.quantity import shorten

# Tests only: a lower floor for stall.timeout, so that a real stall test takes seconds, not minutes.
TEST_FLOOR_ENV = "DDPJOB_TEST_STALL_MIN_S"
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(s|m|h)?\s*$")


def seconds(value: int | str) -> int:
    """``90``, ``"90s"``, ``"5m"``, ``"1h"`` as seconds; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    m = _DURATION_RE.match(value)
    if not m or len(m.group(1)) > 6:
        raise ValueError(value)
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


class StallOptions(BaseModel):
    """A node is *lost* when the first node has not heard its heartbeat (or it has not heard the first
    node's answer) for ``timeout``; a rank is *stuck* when it has been stopped (SIGSTOP) that long; a run
    is *quiet* when no node has written output or made progress for that long (a hung collective).
    ``status`` and ``list`` say which node or rank and since when."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    timeout: int | str = Field(
        "5m",
        description="How long a node may be silent before it is reported: seconds, or '90s', '5m', '1h' "
        "(20 s to 24 h). With action: fail it is also the processes' collective timeout "
        "(DDPJOB_COLLECTIVE_TIMEOUT_S, which the reference trainer passes to init_process_group).",
    )
    action: Literal["report", "fail"] = Field(
        "report",
        description="report: status and list name the silent node, the job runs on; fail: the job ends "
        "FAILED naming the node (every node that can still act stops its processes).",
    )

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, v: int | str) -> int:
        try:
            s = seconds(v)
        except ValueError:
            raise ValueError("must be seconds (an integer) or a duration such as '90s', '5m' or '1h'") from None
        floor = int(os.environ[TEST_FLOOR_ENV]) if os.environ.get(TEST_FLOOR_ENV, "").isdigit() else 20
        if not floor <= s <= 86400:
            raise ValueError(f"must be between 20 s and 24 h (got {shorten(str(s))} s): heartbeats come every 2 s")
        return s

    @property
    def timeout_s(self) -> int:
        return seconds(self.timeout)
