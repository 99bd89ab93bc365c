"""Preemption: a signal asks the run to stop; every rank stops at the same step.

SIGTERM comes from torchrun, Kubernetes and ``scancel``; SIGUSR2 is Slurm's warning signal as
ddpjob requests it (NCCL installs its own SIGUSR1 handler, so that one is not used).
"""

from __future__ import annotations

import signal
from types import FrameType

import torch
import torch.distributed as dist

from launcher.train.distcore import DistInfo

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
_stop = {"requested": False}


def _request_stop(signum: int, frame: FrameType | None) -> None:
    _stop["requested"] = True


def install_signal_handlers() -> None:
    _stop["requested"] = False
    for sig in STOP_SIGNALS:
        signal.signal(sig, _request_stop)


class StopAgreement:
    """Ranks agree whether to stop every ``every`` steps and at the end of each epoch.

    A signal may reach one rank only (a node's agent, one pod), so the ranks must agree before any
    of them leaves the collectives. The same all-reduce carries whether a timed checkpoint is due. Agreeing costs an all-reduce and a host read, so it runs every
    ``every`` steps rather than every step; every rank computes the same schedule, so all stop at
    the same step. A single process has nobody to agree with and checks its flag every step.
    """

    def __init__(self, info: DistInfo, every: int) -> None:
        self.info = info
        self.every = every

    def due(self, step: int, boundary: bool) -> bool:
        return not self.info.collective or boundary or step % self.every == 0

    def agreed(self, checkpoint_due: bool = False) -> tuple[bool, bool]:
        """(stop, checkpoint): whether any rank received a stop signal, and whether any rank's clock says
        a timed checkpoint is due (``cadence.CheckpointClock``), in one all-reduce."""
        flags = [1.0 if _stop["requested"] else 0.0, 1.0 if checkpoint_due else 0.0]
        if self.info.collective:
            t = torch.tensor(flags, device=self.info.device if self.info.device.type == "cuda" else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flags = t.tolist()
        return flags[0] > 0, flags[1] > 0

    def check(self, step: int, boundary: bool = False, checkpoint_due: bool = False) -> tuple[bool, bool]:
        """(stop, checkpoint), the same on every rank at the same step: True once any rank has received
        a stop signal, or its checkpoint clock ran out; (False, False) between agreements."""
        if not self.due(step, boundary):
            return False, False
        return self.agreed(checkpoint_due)
