"""Atomic checkpoints (rank 0 writes; every rank resumes from rank 0's) and their RNG state."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, cast

import torch
import torch.distributed as dist

from launcher.train.distcore import DistInfo

CHECKPOINT = "checkpoint.pt"
# A folder whose checkpoint a run starts from while its own output folder has none (ddpjob rerun --resume).
RESUME_FROM_ENV = "DDPJOB_RESUME_FROM"


# Each rank's RNG state: torch's, Python's (``random.getstate()``) and, with CUDA, each device's. Written
# this way: a key named ``torch`` in a class body would hide the module from the annotations after it.
RngState = TypedDict("RngState", {"torch": torch.Tensor, "python": tuple[object, ...], "cuda": list[torch.Tensor]},  # noqa: UP013
                     total=False)


class Checkpoint(TypedDict, total=False):
    """What ``save`` writes (one of an older trainer may lack the later keys: ``.get`` those)."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, object]
    scheduler: dict[str, object]
    scaler: dict[str, object] | None
    epoch: int
    step_in_epoch: int
    step: int
    rng: RngState
    args: dict[str, object]  # the command line (``TrainConfig.as_record``)
    world_size: int
    steps_per_epoch: int


# What tells two copies of a run's checkpoint apart: step, epoch, step in it, world size.
Identity = tuple[int, int, int, int | None]


def path_in(output_dir: str) -> Path:
    return Path(output_dir) / CHECKPOINT


def save(output_dir: str, state: Checkpoint) -> Path:
    """Write to a temporary file in the same directory, fsync, then rename: a reader never sees half a file."""
    final = path_in(output_dir)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def load(output_dir: str, device: torch.device) -> Checkpoint | None:
    """The run's own checkpoint in ``output_dir``, or None before the first one."""
    p = path_in(output_dir)
    if not p.exists():
        return None
    ckpt: Checkpoint = torch.load(p, map_location=device, weights_only=False)  # save() wrote it
    return ckpt


@dataclass
class Found:
    """The checkpoint a run resumes from (None: it starts from the beginning), where it was and what
    the ranks' agreement on it says (``agree``)."""

    ckpt: Checkpoint | None
    source: Path
    missing_from: Path | None = None  # a $DDPJOB_RESUME_FROM folder without a checkpoint
    sent_from_rank0: bool = False  # rank 0's, sent to the ranks that did not hold it
    dropped_on: list[int] = field(default_factory=list)  # ranks whose own one went unused: rank 0 had none


def find(output_dir: str, device: torch.device) -> Found:
    """This rank's checkpoint: its output directory's, else (``ddpjob rerun --resume``) the one in the
    folder $DDPJOB_RESUME_FROM names, until the run has one of its own."""
    found = Found(load(output_dir, device), path_in(output_dir))
    if found.ckpt is None and (earlier := os.environ.get(RESUME_FROM_ENV)):
        found = Found(load(earlier, device), path_in(earlier))
        if found.ckpt is None:
            found.missing_from = found.source
    return found


def identity(ckpt: Checkpoint | None) -> Identity | None:
    """What tells two copies of a run's checkpoint apart: where in the run, and on what world size."""
    if ckpt is None:
        return None
    return ckpt["step"], ckpt["epoch"], ckpt["step_in_epoch"], ckpt.get("world_size")


def agree(info: DistInfo, found: Found) -> Found:
    """Rank 0's checkpoint is the run's, on every rank (each node may have a filesystem of its own, as
    a Kubernetes pod has, where only rank 0's node holds what rank 0 wrote): each rank tells the one
    it holds (a small gather); when all hold rank 0's, each keeps its own, else rank 0 sends its copy
    to all (on the CPU: no rank's tensors land on another's device; ``load_state_dict`` places them).
    When rank 0 has none, no rank resumes. One process: ``found`` as it is."""
    if not info.collective:
        return found
    held: list[Identity | None] = [None] * info.world_size
    dist.all_gather_object(held, identity(found.ckpt))
    if held[0] is None:
        return Found(None, found.source, found.missing_from, dropped_on=[r for r, h in enumerate(held) if h is not None])
    if all(h == held[0] for h in held):
        return found
    sent: list[object] = [None, None]
    if info.is_main:
        assert found.ckpt is not None  # held[0]
        cpu = found.ckpt if info.device.type == "cpu" else torch.load(found.source, map_location="cpu", weights_only=False)
        sent = [cpu, str(found.source)]
    dist.broadcast_object_list(sent, src=0)
    ckpt = found.ckpt if info.is_main else cast("Checkpoint", sent[0])  # rank 0's, as it sent it
    return Found(ckpt, Path(str(sent[1])), sent_from_rank0=True)


class CheckpointError(Exception):
    """A checkpoint named on the command line is missing or does not fit; the message says which."""


def resolve(path: str) -> Path:
    """``--resume`` names a checkpoint file or a run's output directory (its checkpoint.pt)."""
    p = Path(path)
    p = p / CHECKPOINT if p.is_dir() else p
    if not p.is_file():
        raise CheckpointError(f"no checkpoint at {p}")
    return p


def load_file(path: Path, device: torch.device) -> Checkpoint:
    try:
        ckpt: object = torch.load(path, map_location=device, weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path} is not a checkpoint written by this trainer: {e}") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(f"{path} is not a checkpoint written by this trainer (no 'model' state)")
    return cast("Checkpoint", ckpt)  # a dict with a model's state: this trainer's


def rng_state() -> RngState:
    state: RngState = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: RngState) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
