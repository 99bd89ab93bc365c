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
    of them leaves the collectives. Agreeing costs an all-reduce and a host read, so it runs every
    ``every`` steps rather than every step; every rank computes the same schedule, so all stop at
    the same step. A single process has nobody to agree with and checks its flag every step.
    """

    def __init__(self, info: DistInfo, every: int) -> None:
        self.info = info
        self.every = every

    def due(self, step: int, boundary: bool) -> bool:
        return not self.info.collective or boundary or step % self.every == 0

    def agreed(self) -> bool:
        flag = 1.0 if _stop["requested"] else 0.0
        if self.info.collective:
            t = torch.tensor([flag], device=self.info.device if self.info.device.type == "cuda" else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flag = t.item()
        return flag > 0

    def should_stop(self, step: int, boundary: bool = False) -> bool:
        """True on every rank, at the same step, once any rank has received a stop signal."""
        return self.due(step, boundary) and self.agreed()
