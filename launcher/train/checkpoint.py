"""Atomic checkpoints (rank 0 writes, every rank reads) and their RNG state."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

CHECKPOINT = "checkpoint.pt"
# A folder whose checkpoint a run starts from while its own output folder has none (ddpjob rerun --resume).
RESUME_FROM_ENV = "DDPJOB_RESUME_FROM"


def path_in(output_dir: str) -> Path:
    return Path(output_dir) / CHECKPOINT


def save(output_dir: str, state: dict[str, Any]) -> Path:
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


def load(output_dir: str, device: torch.device) -> dict[str, Any] | None:
    """The run's own checkpoint in ``output_dir``, or None before the first one."""
    p = path_in(output_dir)
    if not p.exists():
        return None
    ckpt: dict[str, Any] = torch.load(p, map_location=device, weights_only=False)  # save() wrote a dict
    return ckpt


class CheckpointError(Exception):
    """A checkpoint named on the command line is missing or does not fit; the message says which."""


def resolve(path: str) -> Path:
    """``--resume`` names a checkpoint file or a run's output directory (its checkpoint.pt)."""
    p = Path(path)
    p = p / CHECKPOINT if p.is_dir() else p
    if not p.is_file():
        raise CheckpointError(f"no checkpoint at {p}")
    return p


def load_file(path: Path, device: torch.device) -> dict[str, Any]:
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path} is not a checkpoint written by this trainer: {e}") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(f"{path} is not a checkpoint written by this trainer (no 'model' state)")
    return ckpt


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
