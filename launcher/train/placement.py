"""Which device a rank computes on and which backend the ranks talk over (no torch import: the
doctor's probe and the tests use it too)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Set by ddpjob's local target when its simulated nodes share GPUs (launcher.targets.shared.dist).
SHARED_GPUS_ENV = "DDPJOB_GPUS_SHARED"


@dataclass(frozen=True)
class Placement:
    """Where a rank computes and how the ranks talk: ``device_index`` None means the CPU."""

    backend: str
    device_index: int | None
    note: str | None = None


def placement(gpus: int, local_rank: int, local_world: int, *, shared_elsewhere: bool = False) -> Placement:
    """The device and backend of one rank: its own GPU with NCCL, else the CPU with Gloo.

    NCCL takes one rank per GPU (two ranks on one GPU fail with "Duplicate GPU detected"). When a
    node has more ranks than GPUs, or ``shared_elsewhere`` (ddpjob's local target runs several
    simulated nodes on one machine's GPUs), ranks share GPUs round-robin and talk over Gloo, which
    reduces GPU tensors too: slower, but the job runs, and ``note`` says so.
    """
    if gpus <= 0:
        return Placement("gloo", None)
    index = local_rank % gpus
    if local_world > gpus or shared_elsewhere:
        why = [f"{local_world} ranks on this node share its {gpus} GPU(s)"] if local_world > gpus else []
        why += ["ranks of other simulated nodes on this machine use the same GPUs"] if shared_elsewhere else []
        return Placement("gloo", index, "; ".join(why) + ": NCCL takes one rank per GPU, so the ranks talk over gloo "
                         "(slower); give every rank its own GPU for NCCL")
    return Placement("nccl", index)


def placement_from_env(gpus: int, env: Mapping[str, str] = os.environ) -> Placement:
    """``placement`` for this process under torchrun: its LOCAL_RANK and LOCAL_WORLD_SIZE, and whether
    ddpjob's local target said the machine's GPUs are shared by other simulated nodes."""
    return placement(gpus, int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "1")),
                     shared_elsewhere=env.get(SHARED_GPUS_ENV) == "1")
