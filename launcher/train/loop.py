"""The training loop: DistributedSampler, AMP, gradient accumulation, checkpoints, preemption."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from launcher.train import checkpoint, data, evaluation, models, parallel, step
from launcher.train.distcore import DistInfo, barrier, mean_over_ranks
from launcher.train.metrics import Metrics, eval_line
from launcher.train.preempt import StopAgreement


def lr_lambda(args: Any, total_steps: int) -> Callable[[int], float]:
    """Linear warmup for ``warmup_steps``, then cosine decay (or constant)."""

    def f(step: int) -> float:
        if args.warmup_steps and step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        if args.schedule == "constant" or total_steps <= args.warmup_steps:
            return 1.0
        progress = (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


class Trainer:
    """One run: built from the command line, resumed from the output directory's checkpoint if any."""

    def __init__(self, args: Any, info: DistInfo) -> None:
        torch.manual_seed(args.seed)
        self.args, self.info = args, info
        if info.is_main:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        barrier(info)
        self.metrics = Metrics(info, args.output_dir)
        train_split, self.eval_split = data.load(args)
        self.model = parallel.wrap(models.build(args.model, args.dataset).to(info.device), args, info)
        lr = args.lr * (info.world_size if args.scale_lr else 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=args.momentum,
                                         weight_decay=args.weight_decay)
        self.scaler = torch.amp.GradScaler(info.device.type) if args.amp == "fp16" else None
        self._build_loader(train_split)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(args, self.total_steps))
        self.criterion = step.loss_fn(args.dataset)
        self.stop = StopAgreement(info, args.stop_check_every)
        self.set_to_none = parallel.zero_grad_to_none(self.model)
        self.step = self.start_epoch = self.skip_steps = 0
        self.last_loss = float("nan")

    def _build_loader(self, split: data.Split) -> None:
        args, info = self.args, self.info
        dataset = TensorDataset(split.inputs, split.targets)
        self.sampler: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=True,
                                          seed=args.seed, drop_last=False)
        self.loader = DataLoader(dataset, batch_size=args.batch_size, sampler=self.sampler, drop_last=True,
                                 num_workers=args.num_workers, pin_memory=info.device.type == "cuda")
        self.steps_per_epoch = len(self.loader) // args.grad_accum
        if self.steps_per_epoch == 0:
            raise ValueError(f"not one step per epoch: {len(self.loader)} batch(es) of {args.batch_size} per process "
                             f"with --grad-accum {args.grad_accum}; lower --batch-size or add data")
        self.total_steps = self.steps_per_epoch * args.epochs
        if args.max_steps:
            self.total_steps = min(self.total_steps, args.max_steps)

    def restore(self) -> None:
        """Continue from the output directory's checkpoint, if there is one."""
        ckpt = checkpoint.load(self.args.output_dir, self.info.device)
        if ckpt is None:
            return
        models.unwrap(self.model).load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        checkpoint.set_rng_state(ckpt["rng"])
        self.step, self.start_epoch, self.skip_steps = ckpt["step"], ckpt["epoch"], ckpt["step_in_epoch"]
        if self.skip_steps >= self.steps_per_epoch:
            self.start_epoch, self.skip_steps = self.start_epoch + 1, 0
        self.metrics.log(
            {"event": "resume", "step": self.step, "epoch": self.start_epoch, "world_size": self.info.world_size},
            f"resumed from {checkpoint.path_in(self.args.output_dir)} at step {self.step} (epoch {self.start_epoch})")

    def save_checkpoint(self, epoch: int, step_in_epoch: int, reason: str) -> None:
        if self.info.is_main:
            checkpoint.save(self.args.output_dir, {
                "model": models.unwrap(self.model).state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None,
                "epoch": epoch, "step_in_epoch": step_in_epoch, "step": self.step, "rng": checkpoint.rng_state(),
                "args": vars(self.args), "world_size": self.info.world_size,
            })
            self.metrics.log({"event": "checkpoint", "step": self.step, "epoch": epoch, "reason": reason})
        barrier(self.info)  # nobody runs ahead (or exits) before the checkpoint is on disk

    def run(self) -> dict[str, Any]:
        """Train to the end (or to a preemption); returns the summary rank 0 writes to summary.json."""
        self.restore()
        run_start, first_step = time.perf_counter(), self.step
        self.window_start, self.window_steps = time.perf_counter(), 0
        preempted = False
        last_eval: tuple[int, dict[str, Any]] | None = None
        self.model.train()
        for epoch in range(self.start_epoch, self.args.epochs):
            if self.step >= self.total_steps:
                break
            preempted = self.train_epoch(epoch)
            if preempted:
                break
            self.save_checkpoint(epoch, self.steps_per_epoch, "epoch_end")
            ev = evaluation.evaluate(self.model, self.eval_split, self.args, self.info)
            last_eval = (self.step, ev)
            self.metrics.log({"event": "eval", "step": self.step, "epoch": epoch, **ev}, f"epoch {epoch} eval {eval_line(ev)}")
        run_time = time.perf_counter() - run_start
        # The last epoch's evaluation already scored these weights; do not pay for it twice.
        if last_eval is not None and last_eval[0] == self.step:
            ev = last_eval[1]
        else:
            ev = evaluation.evaluate(self.model, self.eval_split, self.args, self.info)
        return self.summary(ev, preempted, trained=self.step - first_step, run_time=run_time)

    def train_epoch(self, epoch: int) -> bool:
        """Train one epoch (the rest of it after a resume); True if the run was preempted."""
        args = self.args
        self.sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        batches = iter(self.loader)
        first = self.skip_steps if epoch == self.start_epoch else 0
        for _ in range(first * args.grad_accum):
            next(batches)  # a resumed epoch skips what was already trained on
        for step_in_epoch in range(first, self.steps_per_epoch):
            if self.step >= self.total_steps:
                break
            t0 = time.perf_counter()
            loss = self.train_step(batches)
            if args.step_delay:
                time.sleep(args.step_delay)
            self.log_step(epoch, loss, time.perf_counter() - t0)
            done_in_epoch = step_in_epoch + 1
            if args.checkpoint_every and self.step % args.checkpoint_every == 0 and done_in_epoch < self.steps_per_epoch:
                self.save_checkpoint(epoch, done_in_epoch, "every")
            if self.stop.should_stop(self.step, boundary=done_in_epoch == self.steps_per_epoch or self.step == self.total_steps):
                self.save_checkpoint(epoch, done_in_epoch, "preempted")
                self.metrics.log({"event": "preempted", "step": self.step},
                                 f"preempted: checkpoint at step {self.step}; exiting")
                return True
        return False

    def train_step(self, batches: Any) -> torch.Tensor:
        """One optimizer step over ``--grad-accum`` micro-batches; the mean loss, still on the device."""
        args, k = self.args, self.args.grad_accum
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        micro = step.micro_batches(batches, k, args, self.info, self.step)
        loss = step.accumulate_gradients(self.model, micro, k, self.criterion, self.info.device, args.amp,
                                         self.scaler, sync=not args.bench_no_sync)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss

    def log_step(self, epoch: int, loss: torch.Tensor, step_time: float) -> None:
        """Every ``--log-every`` steps (and the first and last): the only place the loss is read back."""
        self.window_steps += 1
        s = self.step
        if not (s % self.args.log_every == 0 or s == self.total_steps or s == 1):
            return
        mean_loss = mean_over_ranks(self.info, loss)
        self.last_loss = mean_loss
        elapsed = time.perf_counter() - self.window_start
        rate = self.samples_per_step * self.window_steps / elapsed if elapsed > 0 else 0.0
        lr = self.scheduler.get_last_lr()[0]
        self.metrics.log(
            {"event": "step", "step": s, "total_steps": self.total_steps, "epoch": epoch, "loss": mean_loss, "lr": lr,
             "samples_per_s": rate, "step_time": step_time, "world_size": self.info.world_size},
            f"epoch {epoch} step {s}/{self.total_steps} loss {mean_loss:.4f} lr {lr:.4g} {rate:.0f} samples/s (global)",
        )
        self.window_start, self.window_steps = time.perf_counter(), 0

    @property
    def samples_per_step(self) -> int:
        return self.args.batch_size * self.args.grad_accum * self.info.world_size

    def summary(self, ev: dict[str, Any], preempted: bool, trained: int, run_time: float) -> dict[str, Any]:
        args = self.args
        out: dict[str, Any] = {
            "train_loss": self.last_loss, **ev, "steps": self.step, "epochs": args.epochs,
            "world_size": self.info.world_size, "preempted": preempted, "dataset": args.dataset, "model": args.model,
            "samples_per_s": self.samples_per_step * trained / run_time if trained and run_time > 0 else None,
            "strategy": args.strategy, "amp": args.amp, "grad_compression": args.grad_compression,
            "bucket_cap_mb": args.bucket_cap_mb, "sync_bn": args.sync_bn,
        }
        if args.model == "linear" and args.dataset == "linreg":
            lin = models.unwrap(self.model)
            assert isinstance(lin, torch.nn.Linear)  # models.build: linreg's only model
            out["weight"] = float(lin.weight.detach().flatten()[0])
            out["bias"] = float(lin.bias.detach().flatten()[0])
        return out


def train(args: Any, info: DistInfo) -> dict[str, Any]:
    """Run (or resume) training; returns the summary rank 0 writes to summary.json."""
    return Trainer(args, info).run()
