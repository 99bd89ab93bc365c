"""Process group, device and the exact distributed evaluation sharding."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from launcher.train.placement import placement_from_env

if TYPE_CHECKING:
    # Where the store classes are defined: torch.distributed re-exports them only implicitly.
    from torch._C._distributed_c10d import Store


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    distributed: bool
    backend: str = "gloo"
    note: str | None = None  # why the backend is not the usual one (ranks sharing a GPU), for the log

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def collective(self) -> bool:
        """Whether there is anyone to talk to: under torchrun with world size 1 every collective would be
        a no-op that still costs a launch (and, read back, a host sync), so none is made."""
        return self.distributed and self.world_size > 1


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
    distributed = "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    place = placement_from_env(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    device = torch.device("cpu") if place.device_index is None else torch.device("cuda", place.device_index)
    if place.device_index is not None:
        torch.cuda.set_device(device)
    if distributed:
        store = _restart_safe_store(world)
        timeout = collective_timeout()
        # NCCL told its rank's GPU: else it guesses it from the global rank ("can cause a hang") and warns.
        device_id = device if place.backend == "nccl" else None
        if store is None:
            dist.init_process_group(backend=place.backend, init_method="env://", timeout=timeout, device_id=device_id)
        else:
            _STORES.append(store)  # kept alive until teardown: the process group's threads use it
            dist.init_process_group(backend=place.backend, store=store, rank=rank, world_size=world, timeout=timeout,
                                    device_id=device_id)
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, local_rank, device, distributed, place.backend if distributed else "none",
                    place.note if distributed else None)


def collective_timeout() -> timedelta | None:
    """``DDPJOB_COLLECTIVE_TIMEOUT_S`` (ddpjob sets it from the spec's stall.timeout when stall.action
    is fail): how long a collective may wait for a lost peer before it raises. None: torch's default."""
    value = os.environ.get("DDPJOB_COLLECTIVE_TIMEOUT_S", "")
    return timedelta(seconds=int(value)) if value.isdigit() and int(value) > 0 else None


def _restart_safe_store(world: int) -> Store | None:
    """The env:// store, but namespaced by torchrun's restart count; None for plain env://.

    With static rendezvous (``--master-addr/--master-port``: local, Slurm and PyTorchJob all use
    it) torchrun keeps one TCPStore across ``--max-restarts`` rounds, and env:// workers use it
    without a per-attempt prefix (torch 2.14). Restarted workers then read the dead workers'
    Gloo/NCCL addresses and fail with "connectFullMesh ... Connection refused". A prefix per
    attempt gives every round clean keys. Outside torchrun's agent store, plain env:// is right.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None
    from datetime import timedelta

    # The public names (torch.distributed re-exports the C++ classes without declaring them).
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,  # type: ignore[attr-defined]
                        is_master=False, timeout=timedelta(minutes=10))
    return dist.PrefixStore(f"ddpjob/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", tcp)  # type: ignore[attr-defined]


_STORES: list[Store] = []


def teardown(info: DistInfo) -> None:
    """Leave the process group together: no rank tears down while another still talks to it."""
    if info.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _STORES.clear()


def barrier(info: DistInfo) -> None:
    if info.collective:
        dist.barrier()


def all_reduce_sum_(info: DistInfo, t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks, in place (no-op for one process); returns it."""
    if info.collective:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def mean_over_ranks(info: DistInfo, value: torch.Tensor, *more: float) -> list[float]:
    """The means over ranks of a scalar on the device and of ``more`` numbers of the host: one small
    all-reduce (float64) and one host read."""
    t = value.detach().to(torch.float64, copy=True).reshape(1)
    if more:
        t = torch.cat([t, torch.tensor(more, dtype=torch.float64).to(t.device, non_blocking=True)])
    return [v / info.world_size for v in all_reduce_sum_(info, t).tolist()]


def eval_shard(rank: int, world: int) -> slice[int, None, int]:
    """The evaluation samples this rank scores: every ``world``-th from ``rank``, so every sample
    exactly once across ranks.

    DistributedSampler pads the set with repeated samples so every rank gets the same count, which
    counts some samples twice; strided sharding without padding does not.
    """
    return slice(rank, None, world)
