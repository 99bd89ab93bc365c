"""Data parallelism: DDP set up to hide its communication, or the single-process DataParallel baseline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher.train.config import TrainConfig
from launcher.train.distcore import DistInfo
from launcher.train.stepclock import StepClock

if TYPE_CHECKING:
    # Where the class is defined: torch.distributed re-exports it only implicitly.
    from torch._C._distributed_c10d import GradBucket

# Gradients are cast to 16 bits for the all-reduce (half the bytes on the wire) and back to fp32
# for the optimizer. fp16 keeps more mantissa, bf16 more range.
COMPRESSION_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def static_graph_valid(cfg: TrainConfig) -> bool:
    """DDP's ``static_graph`` holds for our models, but not with no_sync micro-steps.

    A static graph is recorded in the first iteration, whose backward must sync: a no_sync
    backward first trips an internal assert in the reducer (torch 2.14).
    """
    return cfg.optim.grad_accum == 1 and not cfg.harness.bench_no_sync


def wrap(model: nn.Module, cfg: TrainConfig, info: DistInfo, clock: StepClock | None = None) -> nn.Module:
    """The model as the chosen strategy trains it: unchanged for a single process (world size 1 under
    torchrun included: DDP there only adds its hooks and a no-op all-reduce, ~12% on a GPU), DDP with
    a communication hook that marks each bucket on ``clock``, and under ``torch.compile`` with
    ``--compile``."""
    if cfg.ddp.strategy == "dp":
        return nn.DataParallel(model) if torch.cuda.device_count() > 1 else model
    if info.collective:
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
        inner = COMPRESSION_HOOKS.get(cfg.ddp.grad_compression, default_hooks.allreduce_hook)
        ddp.register_comm_hook(_HookState(inner, clock, cfg.harness.bench_comm_delay), _timed_hook)
        model = ddp
    if cfg.compile:
        # Compiled around DDP, whose buckets the compiler then splits its graphs at, so the all-reduces
        # still overlap the backward.
        compiled: nn.Module = torch.compile(model)  # type: ignore[assignment]  # an OptimizedModule
        return compiled
    return model


@dataclass(frozen=True)
class _HookState:
    inner: Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]  # Any: torch types the hooks' group ProcessGroup; they take None (the default group)
    clock: StepClock | None
    delay_s: float  # the benchmark's slower all-reduce (--bench-comm-delay)


def _timed_hook(state: _HookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce (or its 16-bit form), with the moment the bucket was ready marked on the clock."""
    if state.clock is not None:
        state.clock.bucket_ready()
    fut = state.inner(None, bucket)  # None: the default process group
    if state.delay_s:
        def later(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            time.sleep(state.delay_s)  # runs where the all-reduce completes: DDP waits for it
            return f.value()

        return fut.then(later)
    return fut


# DDP checks a hook's annotations against the classes themselves, and this module's are strings
# (``from __future__ import annotations``): "bucket annotation should be dist.GradBucket".
_timed_hook.__annotations__.update({
    "bucket": dist.GradBucket,  # type: ignore[attr-defined]
    "return": torch.futures.Future[torch.Tensor],
})


def ddp_of(model: nn.Module) -> DDP | None:
    """The DDP module inside ``model`` (compiled or not), or None."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, DDP) else None


def zero_grad_to_none(model: nn.Module) -> bool:
    """Whether ``zero_grad`` should drop gradients (``set_to_none``) rather than zero them.

    With bucket views, a dropped gradient is allocated again by autograd and copied into its
    bucket every step; zeroing keeps autograd accumulating straight into the bucket.
    """
    return ddp_of(model) is None


def grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[object]:
    """DDP's ``no_sync()`` when this backward must not all-reduce (accumulation micro-steps)."""
    ddp = ddp_of(model)
    if sync or ddp is None:
        return contextlib.nullcontext()
    return ddp.no_sync()

