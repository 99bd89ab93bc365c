"""Process group, device and the exact distributed evaluation sharding."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup() -> DistInfo:
    """Join the process group from ``env://`` (torchrun, a PyTorchJob and Slurm all set it up).

    Without WORLD_SIZE in the environment the program runs as a single plain process.
    """
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    distributed = "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, local_rank, device, distributed)


def teardown(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def all_reduce_sum(info: DistInfo, values: list[float]) -> list[float]:
    """Sum a few numbers over all ranks (float64, so sums of many samples stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=info.device if info.device.type == "cuda" else "cpu")
    if info.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def eval_shard(n: int, rank: int, world: int) -> list[int]:
    """Indices of the evaluation set this rank scores: every index exactly once across ranks.

    DistributedSampler pads the set with repeated samples so every rank gets the same count, which
    counts some samples twice; strided sharding without padding does not.
    """
    return list(range(rank, n, world))
