"""Each rank's own pace, for its node's runner (``launcher.targets.shared.vitals``): every
``REPORT_S`` seconds at most, the rank replaces ``$DDPJOB_VITALS_DIR/rank-<RANK>.json`` (written
whole, then renamed) with its step count, its wall time per step and that step's split into data,
compute and communication (``stepclock``), all in milliseconds per step since its last report.
Nothing is written when the variable is not set (the trainer run by hand)."""

from __future__ import annotations

import json
import os
import time

from launcher.train.stepclock import StepClock

REPORT_S = 2.0
ENV = "DDPJOB_VITALS_DIR"


class StepReport:
    def __init__(self, rank: int, clock: StepClock) -> None:
        folder = os.environ.get(ENV, "")
        self.path = os.path.join(folder, f"rank-{rank}.json") if folder else ""
        self.clock = clock
        self.last, self.last_step = time.perf_counter(), 0

    def due(self) -> bool:
        return bool(self.path) and time.perf_counter() - self.last >= REPORT_S

    def write(self, step: int) -> None:
        """Read the clock's window (the next metrics line's split starts after it) and report it."""
        now = time.perf_counter()
        split = self.clock.read()
        steps, elapsed = step - self.last_step, now - self.last
        self.last, self.last_step = now, step
        if split is None or steps <= 0:
            return
        record = {"step": step, "t": time.time(), "step_ms": round(1000 * elapsed / steps, 3),
                  "data_ms": round(split.data_ms, 3), "compute_ms": round(split.compute_ms, 3),
                  "comm_ms": round(split.comm_ms, 3)}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # the report is for watching the run, never a reason to stop it
