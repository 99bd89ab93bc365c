"""One optimizer step's work: batches onto the device, forward and backward over micro-batches.

Nothing here reads a value back to the host: the loss stays on the device until the loop logs it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from launcher.train import data, models, parallel
from launcher.train.config import TrainConfig
from launcher.train.distcore import DistInfo
from launcher.train.stepclock import StepClock


def loss_fn(dataset: str) -> nn.Module:
    return nn.MSELoss(reduction="mean") if dataset == "linreg" else nn.CrossEntropyLoss()


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[object]:
    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def prepare(inputs: torch.Tensor, dataset: str, device: torch.device, augment_gen: torch.Generator | None,
            channels_last: bool = False) -> torch.Tensor:
    """Batch tensors as the model wants them: copied as uint8 (4x fewer bytes), augmented, normalised on
    the device; a floating-point image batch is normalised already (``batches.InMemoryBatches``)."""
    x = inputs.to(device, non_blocking=True)
    if dataset == "linreg":
        return x
    if x.dtype == torch.uint8:
        if dataset == "cifar10" and augment_gen is not None:
            x = data.augment(x, augment_gen)
        x = data.normalize(x)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def augment_generator(cfg: TrainConfig, info: DistInfo, step: int, micro: int) -> torch.Generator | None:
    """Augmentation randomness is a function of (seed, step, rank, micro-step): exact on resume."""
    if cfg.data.dataset != "cifar10":
        return None
    return torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 4099 + info.rank * 97 + micro)


def micro_batches(batches: Iterator[tuple[torch.Tensor, torch.Tensor]], k: int, cfg: TrainConfig, info: DistInfo, step: int,
                  clock: StepClock | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The step's ``k`` micro-batches, each loaded and prepared only when the previous one is done."""
    cl = models.channels_last(cfg.model, info.device)
    for i in range(k):
        x, y = next(batches)
        if cfg.harness.bench_data_delay:
            time.sleep(cfg.harness.bench_data_delay)
        ready = (prepare(x, cfg.data.dataset, info.device, augment_generator(cfg, info, step, i), cl),
                 y.to(info.device, non_blocking=True))
        if clock is not None:
            clock.data_ready()
        yield ready


def accumulate_gradients(model: nn.Module, micro: Iterable[tuple[torch.Tensor, torch.Tensor]], k: int,
                         criterion: nn.Module, device: torch.device, amp: str,
                         scaler: torch.amp.GradScaler | None, sync: bool = True,
                         clock: StepClock | None = None) -> torch.Tensor:
    """Forward and backward over ``k`` micro-batches; DDP syncs gradients only on the last one.

    Each micro-batch loss is divided by ``k``, so the summed gradient equals that of one batch
    ``k`` times larger. Returns the mean loss of the micro-batches on the device (no host sync):
    float64 when ``k`` > 1 (summed there), the loss itself for one micro-batch (no extra kernels).
    ``sync=False`` keeps every backward inside ``no_sync()``: the benchmark's bound for DDP without
    communication. ``clock`` is told when each backward returns.
    """
    total: torch.Tensor | None = None
    for i, (x, y) in enumerate(micro):
        with parallel.grad_sync(model, sync and i == k - 1):
            with autocast(device, amp):
                out = model(x)
                loss = criterion(out.float(), y)
            scaled = loss / k if k > 1 else loss
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        if clock is not None:
            clock.backward_done()
        if k == 1:
            single: torch.Tensor = loss.detach()
            return single
        if total is None:
            total = torch.zeros((), dtype=torch.float64, device=device)
        total += loss.detach()
    assert total is not None, "no micro-batch"
    return total / k
