"""One optimizer step's work: batches onto the device, forward and backward over micro-batches.

Nothing here reads a value back to the host: the loss stays on the device until the loop logs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from launcher.train import data, parallel
from launcher.train.config import TrainConfig
from launcher.train.distcore import DistInfo


def loss_fn(dataset: str) -> nn.Module:
    return nn.MSELoss(reduction="mean") if dataset == "linreg" else nn.CrossEntropyLoss()


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[Any]:
    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def prepare(inputs: torch.Tensor, dataset: str, device: torch.device, augment_gen: torch.Generator | None) -> torch.Tensor:
    """Batch tensors as the model wants them: copied as uint8 (4x fewer bytes), augmented, normalised on the device."""
    x = inputs.to(device, non_blocking=True)
    if dataset == "linreg":
        return x
    if dataset == "cifar10" and augment_gen is not None:
        x = data.augment(x, augment_gen)
    return data.normalize(x)


def augment_generator(cfg: TrainConfig, info: DistInfo, step: int, micro: int) -> torch.Generator | None:
    """Augmentation randomness is a function of (seed, step, rank, micro-step): exact on resume."""
    if cfg.data.dataset != "cifar10":
        return None
    return torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 4099 + info.rank * 97 + micro)


def micro_batches(batches: Iterator[Any], k: int, cfg: TrainConfig, info: DistInfo,
                  step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The step's ``k`` micro-batches, each loaded and prepared only when the previous one is done."""
    for i in range(k):
        x, y = next(batches)
        yield (prepare(x, cfg.data.dataset, info.device, augment_generator(cfg, info, step, i)),
               y.to(info.device, non_blocking=True))


def accumulate_gradients(model: nn.Module, micro: Iterable[tuple[torch.Tensor, torch.Tensor]], k: int,
                         criterion: nn.Module, device: torch.device, amp: str,
                         scaler: torch.amp.GradScaler | None, sync: bool = True) -> torch.Tensor:
    """Forward and backward over ``k`` micro-batches; DDP syncs gradients only on the last one.

    Each micro-batch loss is divided by ``k``, so the summed gradient equals that of one batch
    ``k`` times larger. Returns the mean loss of the micro-batches as a float64 tensor on the
    device (no host sync). ``sync=False`` keeps every backward inside ``no_sync()``: the
    benchmark's bound for DDP without communication.
    """
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i, (x, y) in enumerate(micro):
        with parallel.grad_sync(model, sync and i == k - 1):
            with autocast(device, amp):
                out = model(x)
                loss = criterion(out.float(), y)
            scaled = loss / k
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total += loss.detach()
    return total / k
