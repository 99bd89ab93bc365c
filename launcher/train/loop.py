"""The training loop: DDP, DistributedSampler, AMP, gradient accumulation, checkpoints, preemption."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from launcher.train import checkpoint, data, models
from launcher.train.distcore import DistInfo, all_reduce_sum, barrier, eval_shard

# Preemption: SIGTERM (torchrun, Kubernetes, `scancel`) and SIGUSR2 (Slurm's warning signal as
# ddpjob requests it; NCCL installs its own SIGUSR1 handler, so that one is not used).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
_stop = {"requested": False}


def _request_stop(signum: int, frame: Any) -> None:
    _stop["requested"] = True


def install_signal_handlers() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _request_stop)


class Metrics:
    """Rank 0 appends JSON lines to metrics.jsonl and prints a compact progress line."""

    def __init__(self, info: DistInfo, output_dir: str) -> None:
        self.info = info
        self.path = Path(output_dir) / "metrics.jsonl"

    def log(self, record: dict[str, Any], line: str | None = None) -> None:
        if not self.info.is_main:
            return
        record = {"time": round(time.time(), 3), **record}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        if line:
            print(line, flush=True)


def loss_fn(dataset: str) -> nn.Module:
    return nn.MSELoss(reduction="mean") if dataset == "linreg" else nn.CrossEntropyLoss()


def prepare(inputs: torch.Tensor, dataset: str, device: torch.device, augment_gen: torch.Generator | None) -> torch.Tensor:
    """Batch tensors as the model wants them: images augmented (training) and normalised."""
    if dataset == "linreg":
        return inputs.to(device, non_blocking=True)
    if dataset == "cifar10" and augment_gen is not None:
        inputs = data.augment(inputs, augment_gen)
    return data.normalize(inputs.to(device, non_blocking=True))


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[Any]:
    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def accumulate_gradients(model: nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                         criterion: nn.Module, device: torch.device, amp: str,
                         scaler: torch.amp.GradScaler | None) -> float:
    """Forward and backward over K micro-batches; DDP syncs gradients only on the last one.

    Each micro-batch loss is divided by K, so the summed gradient equals that of one batch K
    times larger. Returns the mean loss of the micro-batches.
    """
    k = len(micro_batches)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        sync = i == k - 1
        ctx = model.no_sync() if (isinstance(model, DDP) and not sync) else contextlib.nullcontext()
        with ctx:
            with autocast(device, amp):
                out = model(x)
                loss = criterion(out.float(), y)
            scaled = loss / k
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total += loss.item()
    return total / k


@torch.no_grad()
def evaluate(model: nn.Module, split: data.Split, args: Any, info: DistInfo) -> dict[str, float | int | None]:
    """Exact distributed evaluation: each sample once; sums of loss, correct and count reduced over ranks."""
    model.eval()
    idx = eval_shard(len(split), info.rank, info.world_size)
    loader = DataLoader(Subset(TensorDataset(split.inputs, split.targets), idx), batch_size=args.eval_batch_size)
    criterion = nn.MSELoss(reduction="sum") if args.dataset == "linreg" else nn.CrossEntropyLoss(reduction="sum")
    loss_sum = correct = count = 0.0
    net = models.unwrap(model)  # evaluation needs no gradient sync
    for x, y in loader:
        x = prepare(x, args.dataset, info.device, None)
        y = y.to(info.device)
        with autocast(info.device, args.amp):
            out = net(x)
        loss_sum += criterion(out.float(), y).item()
        if args.dataset != "linreg":
            correct += (out.argmax(1) == y).sum().item()
        count += len(y)
    loss_sum, correct, count = all_reduce_sum(info, [loss_sum, correct, count])
    model.train()
    return {
        "eval_loss": loss_sum / count if count else float("nan"),
        "eval_accuracy": (correct / count if count else 0.0) if args.dataset != "linreg" else None,
        "eval_samples": int(count),
    }


def lr_lambda(args: Any, total_steps: int):
    """Linear warmup for ``warmup_steps``, then cosine decay (or constant)."""

    def f(step: int) -> float:
        if args.warmup_steps and step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        if args.schedule == "constant" or total_steps <= args.warmup_steps:
            return 1.0
        progress = (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def train(args: Any, info: DistInfo) -> dict[str, Any]:
    """Run (or resume) training; returns the summary rank 0 writes to summary.json."""
    torch.manual_seed(args.seed)
    out_dir = args.output_dir
    if info.is_main:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    barrier(info)
    metrics = Metrics(info, out_dir)
    train_split, eval_split = data.load(args)

    model = models.build(args.model, args.dataset).to(info.device)
    if args.strategy == "ddp" and info.distributed:
        model = DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    elif args.strategy == "dp" and torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    lr = args.lr * (info.world_size if args.scale_lr else 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler(info.device.type) if args.amp == "fp16" else None

    dataset = TensorDataset(train_split.inputs, train_split.targets)
    sampler = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=True,
                                 seed=args.seed, drop_last=False)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.num_workers, pin_memory=info.device.type == "cuda")
    steps_per_epoch = len(loader) // args.grad_accum
    if steps_per_epoch == 0:
        raise ValueError(f"not one step per epoch: {len(loader)} batch(es) of {args.batch_size} per process "
                         f"with --grad-accum {args.grad_accum}; lower --batch-size or add data")
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args, total_steps))
    criterion = loss_fn(args.dataset)

    step = 0
    start_epoch, skip_steps = 0, 0
    ckpt = checkpoint.load(out_dir, info.device)
    if ckpt is not None:
        models.unwrap(model).load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        checkpoint.set_rng_state(ckpt["rng"])
        step, start_epoch, skip_steps = ckpt["step"], ckpt["epoch"], ckpt["step_in_epoch"]
        if skip_steps >= steps_per_epoch:
            start_epoch, skip_steps = start_epoch + 1, 0
        metrics.log({"event": "resume", "step": step, "epoch": start_epoch, "world_size": info.world_size},
                    f"resumed from {checkpoint.path_in(out_dir)} at step {step} (epoch {start_epoch})")

    def save_checkpoint(epoch: int, step_in_epoch: int, reason: str) -> None:
        if info.is_main:
            checkpoint.save(out_dir, {
                "model": models.unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict() if scaler else None,
                "epoch": epoch, "step_in_epoch": step_in_epoch, "step": step, "rng": checkpoint.rng_state(),
                "args": vars(args), "world_size": info.world_size,
            })
            metrics.log({"event": "checkpoint", "step": step, "epoch": epoch, "reason": reason})
        barrier(info)  # nobody runs ahead (or exits) before the checkpoint is on disk

    per_step_samples = args.batch_size * args.grad_accum * info.world_size
    run_start, run_first_step = time.perf_counter(), step
    last_loss = float("nan")
    preempted = False
    last_eval: tuple[int, dict[str, Any]] | None = None
    window_start, window_steps = time.perf_counter(), 0
    model.train()
    for epoch in range(start_epoch, args.epochs):
        if step >= total_steps:
            break
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        batches = iter(loader)
        first = skip_steps if epoch == start_epoch else 0
        for _ in range(first * args.grad_accum):
            next(batches)  # a resumed epoch skips what was already trained on
        for step_in_epoch in range(first, steps_per_epoch):
            if step >= total_steps:
                break
            t0 = time.perf_counter()
            micro = []
            for k in range(args.grad_accum):
                x, y = next(batches)
                # Augmentation randomness is a function of (seed, step, rank, micro-step): exact on resume.
                g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 4099 + info.rank * 97 + k)
                micro.append((prepare(x, args.dataset, info.device, g), y.to(info.device, non_blocking=True)))
            optimizer.zero_grad(set_to_none=True)
            loss = accumulate_gradients(model, micro, criterion, info.device, args.amp, scaler)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            step += 1
            window_steps += 1
            if args.step_delay:
                time.sleep(args.step_delay)
            step_time = time.perf_counter() - t0
            if step % args.log_every == 0 or step == total_steps or step == 1:
                mean_loss = all_reduce_sum(info, [loss])[0] / info.world_size  # logging only: one small all_reduce
                last_loss = mean_loss
                elapsed = time.perf_counter() - window_start
                rate = per_step_samples * window_steps / elapsed if elapsed > 0 else 0.0
                metrics.log(
                    {"event": "step", "step": step, "epoch": epoch, "loss": mean_loss, "lr": scheduler.get_last_lr()[0],
                     "samples_per_s": rate, "step_time": step_time, "world_size": info.world_size},
                    f"epoch {epoch} step {step}/{total_steps} loss {mean_loss:.4f} lr {scheduler.get_last_lr()[0]:.4g} "
                    f"{rate:.0f} samples/s (global)",
                )
                window_start, window_steps = time.perf_counter(), 0
            done_in_epoch = step_in_epoch + 1
            if args.checkpoint_every and step % args.checkpoint_every == 0 and done_in_epoch < steps_per_epoch:
                save_checkpoint(epoch, done_in_epoch, "every")
            if _stop_agreed(info):
                save_checkpoint(epoch, done_in_epoch, "preempted")
                metrics.log({"event": "preempted", "step": step}, f"preempted: checkpoint at step {step}; exiting")
                preempted = True
                break
        if preempted:
            break
        save_checkpoint(epoch, steps_per_epoch, "epoch_end")
        ev = evaluate(model, eval_split, args, info)
        last_eval = (step, ev)
        metrics.log({"event": "eval", "step": step, "epoch": epoch, **ev},
                    f"epoch {epoch} eval loss {ev['eval_loss']:.4f}"
                    + (f" accuracy {ev['eval_accuracy']:.4f}" if ev["eval_accuracy"] is not None else "")
                    + f" on {ev['eval_samples']} samples")

    run_time = time.perf_counter() - run_start
    # The last epoch's evaluation already scored these weights; do not pay for it twice.
    ev = last_eval[1] if last_eval is not None and last_eval[0] == step else evaluate(model, eval_split, args, info)
    trained = step - run_first_step
    summary: dict[str, Any] = {
        "train_loss": last_loss, **ev, "steps": step, "epochs": args.epochs, "world_size": info.world_size,
        "samples_per_s": per_step_samples * trained / run_time if trained and run_time > 0 else None, "preempted": preempted, "dataset": args.dataset, "model": args.model,
        "strategy": args.strategy, "amp": args.amp,
    }
    if args.model == "linear" and args.dataset == "linreg":
        lin = models.unwrap(model)
        summary["weight"] = float(lin.weight.detach().flatten()[0])
        summary["bias"] = float(lin.bias.detach().flatten()[0])
    return summary


def _stop_agreed(info: DistInfo) -> bool:
    """Every rank stops at the same step if any of them received a preemption signal."""
    flag = 1.0 if _stop["requested"] else 0.0
    if info.distributed:
        t = torch.tensor([flag], device=info.device if info.device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        flag = t.item()
    return flag > 0


def write_summary(output_dir: str, summary: dict[str, Any]) -> None:
    path = Path(output_dir) / "summary.json"
    tmp = path.with_name(".summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
