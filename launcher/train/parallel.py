"""Data parallelism: DDP set up to hide its communication, or the single-process DataParallel baseline."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher.train.config import TrainConfig
from launcher.train.distcore import DistInfo

# Gradients are cast to 16 bits for the all-reduce (half the bytes on the wire) and back to fp32
# for the optimizer. fp16 keeps more mantissa, bf16 more range.
COMPRESSION_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def static_graph_valid(cfg: TrainConfig) -> bool:
    """DDP's ``static_graph`` holds for our models, but not with no_sync micro-steps.

    A static graph is recorded in the first iteration, whose backward must sync: a no_sync
    backward first trips an internal assert in the reducer (torch 2.14).
    """
    return cfg.optim.grad_accum == 1 and not cfg.harness.bench_no_sync


def wrap(model: nn.Module, cfg: TrainConfig, info: DistInfo) -> nn.Module:
    """The model as the chosen strategy trains it (unchanged for a single DDP process)."""
    if cfg.ddp.strategy == "dp":
        return nn.DataParallel(model) if torch.cuda.device_count() > 1 else model
    if not info.distributed:
        return model
    if cfg.ddp.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]  # unannotated in torch
    ddp = DDP(
        model,
        device_ids=[info.device.index] if info.device.type == "cuda" else None,
        # Gradients live in the communication buckets: no copy into and out of them each step.
        gradient_as_bucket_view=True,
        bucket_cap_mb=cfg.ddp.bucket_cap_mb,
        static_graph=static_graph_valid(cfg),
    )
    if cfg.ddp.grad_compression != "none":
        ddp.register_comm_hook(None, COMPRESSION_HOOKS[cfg.ddp.grad_compression])
    return ddp


def zero_grad_to_none(model: nn.Module) -> bool:
    """Whether ``zero_grad`` should drop gradients (``set_to_none``) rather than zero them.

    With bucket views, a dropped gradient is allocated again by autograd and copied into its
    bucket every step; zeroing keeps autograd accumulating straight into the bucket.
    """
    return not isinstance(model, DDP)


def grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """DDP's ``no_sync()`` when this backward must not all-reduce (accumulation micro-steps)."""
    if sync or not isinstance(model, DDP):
        return contextlib.nullcontext()
    return model.no_sync()

