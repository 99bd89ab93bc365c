"""Each rank's own pace, for its node's runner (``launcher.targets.shared.vitals``): every
``REPORT_S`` seconds at most, the rank replaces ``$DDPJOB_VITALS_DIR/rank-<RANK>.json`` (written
whole, then renamed) with its step count, its wall time per step and that step's split into data,
compute and communication (``stepclock``), all in milliseconds per step since its last report; on a
GPU, which GPU it is (its UUID, as 32 hex digits) and the memory PyTorch holds there, because inside
a container ``nvidia-smi`` lists the host's process ids, which the runner cannot match to its ranks.
Nothing is written when the variable is not set (the trainer run by hand)."""

from __future__ import annotations

import json
import os
import time

import torch

from launcher.train.stepclock import StepClock

REPORT_S = 2.0
ENV = "DDPJOB_VITALS_DIR"


def gpu_identity(device: torch.device) -> str | None:
    """The UUID of the GPU ``device`` is, as 32 lower-case hex digits (``nvidia-smi`` prints the same
    number as ``GPU-xxxxxxxx-xxxx-...``); None on a CPU or where the driver does not say."""
    if device.type != "cuda":
        return None
    try:
        uuid = torch.cuda.get_device_properties(device).uuid
    except (AttributeError, RuntimeError, AssertionError):
        return None
    raw = getattr(uuid, "bytes", None)  # torch's _CUuuid: the driver's 16 bytes
    text = bytes(raw).hex() if raw is not None else ""
    return text if len(text) == 32 and text.strip("0") else None


class StepReport:
    def __init__(self, rank: int, clock: StepClock, device: torch.device | None = None) -> None:
        folder = os.environ.get(ENV, "")
        self.path = os.path.join(folder, f"rank-{rank}.json") if folder else ""
        self.clock = clock
        self.last, self.last_step = time.perf_counter(), 0
        self.device = device if device is not None and device.type == "cuda" else None
        self.gpu = gpu_identity(self.device) if self.device is not None and self.path else None

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
        record: dict[str, object] = {"step": step, "t": time.time(), "step_ms": round(1000 * elapsed / steps, 3),
                  "data_ms": round(split.data_ms, 3), "compute_ms": round(split.compute_ms, 3),
                  "comm_ms": round(split.comm_ms, 3)}
        if self.gpu is not None and self.device is not None:  # what the allocator holds: no GPU sync
            record["gpu"] = {"uuid": self.gpu, "reserved_mib": round(torch.cuda.memory_reserved(self.device) / 2**20, 1)}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # the report is for watching the run, never a reason to stop it
