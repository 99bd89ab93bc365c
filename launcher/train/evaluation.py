"""Exact distributed evaluation, and ``--eval-only`` for a checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from launcher.train import checkpoint, data, models
from launcher.train.config import EvalOnlyConfig, TrainConfig
from launcher.train.distcore import DistInfo, all_reduce_sum_, barrier, eval_shard
from launcher.train.step import autocast, prepare


def broadcast_buffers(model: nn.Module, info: DistInfo) -> None:
    """Every rank takes rank 0's buffers (BatchNorm running statistics), one broadcast per dtype.

    Each rank's BatchNorm updates its running statistics from its own batches (DDP broadcasts
    rank 0's buffers at the start of each forward, so they drift apart within the step). Without
    this, ranks would score their shards with different models, none of them the one rank 0
    checkpoints.
    """
    if not info.collective:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in models.unwrap(model).buffers():
        by_dtype.setdefault(b.dtype, []).append(b)
    for group in by_dtype.values():
        flat = torch.cat([b.reshape(-1) for b in group])
        dist.broadcast(flat, src=0)
        for b, value in zip(group, torch.split(flat, [b.numel() for b in group])):
            b.copy_(value.view_as(b))


@torch.no_grad()
def evaluate(model: nn.Module, split: data.Split, cfg: TrainConfig, info: DistInfo,
             model_name: str | None = None) -> dict[str, float | int | None]:
    """Exact distributed evaluation of rank 0's model: each sample once, sums reduced over ranks.

    Sums stay on the device (float64) and are read once, after the all-reduce.
    """
    broadcast_buffers(model, info)
    net = models.unwrap(model)  # evaluation needs no gradient sync, nor the compiled training graph
    was_training = net.training
    net.eval()
    # cuDNN's heuristics, not its timing runs, choose the kernels: the same in every process, so this
    # equals a later --eval-only of the checkpoint.
    benchmark, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, False
    # This rank's share, every sample once, batched by slicing: no per-sample collation.
    share = eval_shard(info.rank, info.world_size)
    inputs, targets = split.inputs[share], split.targets[share]
    regression = cfg.data.dataset == "linreg"
    criterion = nn.MSELoss(reduction="sum") if regression else nn.CrossEntropyLoss(reduction="sum")
    sums = torch.zeros(3, dtype=torch.float64, device=info.device)  # loss, correct, count
    cl = models.channels_last(model_name or cfg.model, info.device)
    bs = cfg.data.eval_batch_size
    for start in range(0, len(targets), bs):
        x = prepare(inputs[start:start + bs], cfg.data.dataset, info.device, None, cl)
        y = targets[start:start + bs].to(info.device, non_blocking=True)
        with autocast(info.device, cfg.amp):
            out = net(x)
        sums[0] += criterion(out.float(), y)
        if not regression:
            sums[1] += (out.argmax(1) == y).sum()
        sums[2] += len(y)
    torch.backends.cudnn.benchmark = benchmark
    loss_sum, correct, count = all_reduce_sum_(info, sums).tolist()
    net.train(was_training)
    return {
        "eval_loss": loss_sum / count if count else float("nan"),
        "eval_accuracy": None if regression else (correct / count if count else 0.0),
        "eval_samples": int(count),
    }


def evaluate_checkpoint(cfg: TrainConfig, eval_only: EvalOnlyConfig, info: DistInfo) -> dict[str, object]:
    """``--eval-only``: score the checkpoint ``--resume`` names on the eval split of the data options.

    The model comes from the checkpoint; ``--model``, when given, must agree with it.
    """
    path = checkpoint.resolve(eval_only.resume)
    ckpt = checkpoint.load_file(path, info.device)
    trained = ckpt.get("args") or {}
    model_name = str(trained.get("model") or eval_only.model or "mlp")  # the checkpoint's: a name
    if eval_only.model and eval_only.model != model_name:
        raise checkpoint.CheckpointError(f"{path} holds a {model_name} model, not --model {eval_only.model}")
    if info.is_main:
        Path(cfg.output.output_dir).mkdir(parents=True, exist_ok=True)
    barrier(info)
    dataset = cfg.data.dataset
    try:
        model = models.place(models.build(model_name, dataset), model_name, info.device)
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, ValueError) as e:
        raise checkpoint.CheckpointError(
            f"{path} ({model_name}, trained on {trained.get('dataset', '?')}) does not fit --dataset {dataset}: {e}"
        ) from e
    ev = evaluate(model, data.load_eval(cfg.data, cfg.seed), cfg, info, model_name)
    return {**ev, "eval_only": True, "checkpoint": str(path), "steps": ckpt.get("step"), "model": model_name,
            "dataset": dataset, "world_size": info.world_size, "amp": cfg.amp}
