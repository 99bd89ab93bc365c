"""The training loop: DistributedSampler, AMP, gradient accumulation, checkpoints, preemption."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler, TensorDataset

from launcher.train import checkpoint, data, evaluation, models, parallel, step
from launcher.train.batches import EpochBatches, InMemoryBatches, LoaderBatches
from launcher.train.cadence import CheckpointClock
from launcher.train.config import OptimConfig, TrainConfig
from launcher.train.distcore import DistInfo, barrier, mean_over_ranks
from launcher.train.metrics import Metrics, eval_line
from launcher.train.preempt import StopAgreement
from launcher.train.stepclock import StepClock
from launcher.train.vitals import StepReport


def lr_lambda(optim: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warmup for ``warmup_steps``, then cosine decay (or constant)."""
    warmup = optim.warmup_steps

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if optim.schedule == "constant" or total_steps <= warmup:
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


class Trainer:
    """One run: built from the command line, resumed from the output directory's checkpoint if any."""

    def __init__(self, cfg: TrainConfig, info: DistInfo) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.info = cfg, info
        self.output_dir = cfg.output.output_dir
        if info.is_main:
            Path(self.output_dir).mkdir(parents=True, exist_ok=True)
        barrier(info)
        self.metrics = Metrics(info, self.output_dir, tensorboard=cfg.output.tensorboard)
        train_split, self.eval_split = data.load(cfg.data, cfg.seed)
        if info.device.type == "cuda":
            # Training shapes never change (the last partial batch is dropped): cuDNN may time its kernels
            # once and keep the fastest. Evaluation turns it off (evaluation.evaluate).
            torch.backends.cudnn.benchmark = True
        self.clock = StepClock(info.device, enabled=not cfg.harness.bench_no_split)
        self.report = StepReport(info.rank, self.clock, info.device)
        net = models.place(models.build(cfg.model, cfg.data.dataset), cfg.model, info.device)
        self.model = parallel.wrap(net, cfg, info, self.clock)
        optim = cfg.optim
        lr = optim.lr * (info.world_size if optim.scale_lr else 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=optim.momentum,
                                         weight_decay=optim.weight_decay, **fused_sgd(info.device))
        self.scaler = torch.amp.GradScaler(info.device.type) if cfg.amp == "fp16" else None
        self._build_batches(train_split)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(optim, self.total_steps))
        self.criterion = step.loss_fn(cfg.data.dataset)
        self.stop = StopAgreement(info, cfg.ddp.stop_check_every)
        self.checkpoint_clock = CheckpointClock(cfg.output.checkpoint_seconds)
        self.set_to_none = parallel.zero_grad_to_none(self.model)
        self.step = self.start_epoch = self.skip_steps = 0
        self.resumed_at: int | None = None  # the step a resumed run started from (its first step is logged)
        self.last_loss = float("nan")
        self.compile_s: float | None = None
        self.excluded_s = 0.0  # checkpoint and evaluation time inside the current window: not training
        self.paused_s = 0.0  # the same over the whole run

    def _build_batches(self, split: data.Split) -> None:
        optim, info = self.cfg.optim, self.info
        sampler: DistributedSampler[int] = DistributedSampler(
            TensorDataset(split.inputs, split.targets), num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=self.cfg.seed,
            drop_last=False)
        self.batches: EpochBatches
        if self.cfg.data.num_workers > 0:
            self.batches = LoaderBatches(split, sampler, optim.batch_size, info.device, self.cfg.data.num_workers)
        else:
            # CIFAR-10's training batches are augmented (on uint8, before normalising): they stay raw.
            self.batches = InMemoryBatches(split, sampler, optim.batch_size, info.device,
                                           normalize=self.cfg.data.dataset != "cifar10",
                                           channels_last=models.channels_last(self.cfg.model, info.device))
        self.steps_per_epoch = len(self.batches) // optim.grad_accum
        if self.steps_per_epoch == 0:
            raise ValueError(f"not one step per epoch: {len(self.batches)} batch(es) of {optim.batch_size} per process "
                             f"with --grad-accum {optim.grad_accum}; lower --batch-size or add data")
        self.total_steps = self.steps_per_epoch * optim.epochs
        if optim.max_steps:
            self.total_steps = min(self.total_steps, optim.max_steps)

    def restore(self) -> None:
        """Continue from rank 0's checkpoint (its output directory's), if it has one, on every rank
        (``checkpoint.agree``: a node without it gets rank 0's copy) and on this world size: when it
        differs from the checkpoint's, the place in the epoch is kept in samples (the sampler's order of
        an epoch is the same on any world size: ``resume_point``) and the learning-rate schedule is
        taken at the step that place is on this world size (with --scale-lr, from this world size's rate)."""
        found = checkpoint.agree(self.info, checkpoint.find(self.output_dir, self.info.device))
        ckpt, source = found.ckpt, found.source
        if found.missing_from is not None:  # a run restarted with ddpjob rerun --resume, from a folder without one
            self.metrics.log({"event": "no_resume", "from": str(found.missing_from)},
                             f"{checkpoint.RESUME_FROM_ENV}: no checkpoint at {found.missing_from}; starting from the beginning")
        if found.dropped_on:
            self.metrics.log({"event": "no_resume", "from": str(source), "ranks_with_checkpoint": found.dropped_on},
                             f"rank 0 has no checkpoint at {source}; rank(s) {', '.join(map(str, found.dropped_on))} hold one "
                             "of their own: no rank resumes; starting from the beginning")
        if ckpt is None:
            return
        models.unwrap(self.model).load_state_dict(ckpt["model"])
        base_lrs = [float(lr) for lr in self.scheduler.base_lrs]  # this world size's (--scale-lr)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        for group in self.optimizer.param_groups:  # this device's implementation, not the one that saved it
            group["fused"] = fused_sgd(self.info.device).get("fused")
        if self.scaler is not None and (scaler := ckpt.get("scaler")):
            self.scaler.load_state_dict(scaler)
        checkpoint.set_rng_state(ckpt["rng"])
        saved_world = int(ckpt.get("world_size") or self.info.world_size)
        args = ckpt.get("args") or {}
        per_step = self.cfg.optim.batch_size * self.cfg.optim.grad_accum
        saved_per_step = _int(args.get("batch_size", self.cfg.optim.batch_size)) * _int(args.get("grad_accum", self.cfg.optim.grad_accum))
        self.start_epoch, self.skip_steps = resume_point(
            ckpt["epoch"], ckpt["step_in_epoch"], saved_samples_per_step=saved_per_step * saved_world,
            saved_steps_per_epoch=int(ckpt.get("steps_per_epoch") or self.steps_per_epoch),
            samples_per_step=per_step * self.info.world_size)
        if saved_world == self.info.world_size and saved_per_step == per_step:
            self.scheduler.load_state_dict(ckpt["scheduler"])
            self.step = ckpt["step"]
        else:
            self.step = min(self.total_steps, self.start_epoch * self.steps_per_epoch + self.skip_steps)
            follow_schedule(self.scheduler, self.optimizer, base_lrs, self.step)
        if self.skip_steps >= self.steps_per_epoch:
            self.start_epoch, self.skip_steps = self.start_epoch + 1, 0
        self.resumed_at = self.step
        moved = (f"; the checkpoint's step {ckpt['step']} on world size {saved_world} is step {self.step} on "
                 f"{self.info.world_size}" if saved_world != self.info.world_size else "")
        self.metrics.log(
            {"event": "resume", "step": self.step, "epoch": self.start_epoch, "world_size": self.info.world_size,
             "checkpoint_step": ckpt["step"], "checkpoint_world_size": saved_world,
             "restart": restart_count(), "from": str(source), **({"sent_from_rank0": True} if found.sent_from_rank0 else {})},
            f"resumed from {source} at step {self.step} (epoch {self.start_epoch})" + moved
            + (" (rank 0's checkpoint, sent to ranks without it)" if found.sent_from_rank0 else ""))

    def save_checkpoint(self, epoch: int, step_in_epoch: int, reason: str) -> None:
        started = time.perf_counter()
        if self.info.is_main:
            checkpoint.save(self.output_dir, {
                "model": models.unwrap(self.model).state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None,
                "epoch": epoch, "step_in_epoch": step_in_epoch, "step": self.step, "rng": checkpoint.rng_state(),
                "args": self.cfg.as_record(), "world_size": self.info.world_size,
                "steps_per_epoch": self.steps_per_epoch,
            })
            self.metrics.log({"event": "checkpoint", "step": self.step, "epoch": epoch, "reason": reason})
        barrier(self.info)  # nobody runs ahead (or exits) before the checkpoint is on disk
        self.checkpoint_clock.taken(time.perf_counter() - started)

    def run(self) -> dict[str, object]:
        """Train to the end (or to a preemption); returns the summary rank 0 writes to summary.json."""
        self.restore()
        run_start, first_step = time.perf_counter(), self.step
        self.window_start, self.window_steps = time.perf_counter(), 0
        preempted = False
        last_eval: tuple[int, dict[str, float | int | None]] | None = None
        self.model.train()
        if self.info.is_main:
            print(f"batches: {self.batches.where}", flush=True)
        for epoch in range(self.start_epoch, self.cfg.optim.epochs):
            if self.step >= self.total_steps:
                break
            preempted = self.train_epoch(epoch)
            if preempted:
                break
            paused = time.perf_counter()
            self.save_checkpoint(epoch, self.steps_per_epoch, "epoch_end")
            ev = evaluation.evaluate(self.model, self.eval_split, self.cfg, self.info)
            last_eval = (self.step, ev)
            self.metrics.log({"event": "eval", "step": self.step, "epoch": epoch, **ev}, f"epoch {epoch} eval {eval_line(ev)}")
            self.pause(paused)
        run_time = time.perf_counter() - run_start
        # The last epoch's evaluation already scored these weights; do not pay for it twice.
        if last_eval is not None and last_eval[0] == self.step:
            ev = last_eval[1]
        else:
            ev = evaluation.evaluate(self.model, self.eval_split, self.cfg, self.info)
        if self.compile_s is not None:  # the compiling step is no training throughput
            run_time, first_step = run_time - self.compile_s, first_step + 1
        run_time -= self.paused_s  # nor are checkpoints and evaluations
        return self.summary(ev, preempted, trained=self.step - first_step, run_time=run_time)

    def train_epoch(self, epoch: int) -> bool:
        """Train one epoch (the rest of it after a resume); True if the run was preempted."""
        k, every = self.cfg.optim.grad_accum, self.cfg.output.checkpoint_every
        first = self.skip_steps if epoch == self.start_epoch else 0
        batches = self.batches.epoch(epoch, skip=first * k)  # a resumed epoch skips what was already trained on
        for step_in_epoch in range(first, self.steps_per_epoch):
            if self.step >= self.total_steps:
                break
            t0 = time.perf_counter()
            loss = self.train_step(batches)
            if self.cfg.compile and self.compile_s is None:
                self.compiled(loss, t0)
            if self.cfg.harness.step_delay:
                time.sleep(self.cfg.harness.step_delay)
            self.log_step(epoch, loss, time.perf_counter() - t0)
            if self.report.due():
                self.report.write(self.step)
            done_in_epoch = step_in_epoch + 1
            last = done_in_epoch == self.steps_per_epoch or self.step == self.total_steps  # run() checkpoints next
            stop, timed = self.stop.check(self.step, boundary=last, checkpoint_due=self.checkpoint_clock.due())
            if stop:
                self.save_checkpoint(epoch, done_in_epoch, "preempted")
                self.metrics.log({"event": "preempted", "step": self.step},
                                 f"preempted: checkpoint at step {self.step}; exiting")
                return True
            stepped = bool(every) and self.step % every == 0
            if (stepped or timed) and not last:
                paused = time.perf_counter()
                self.save_checkpoint(epoch, done_in_epoch, "every" if stepped else "time")
                self.pause(paused)
        return False

    def pause(self, since: float) -> None:
        """Time since ``since`` went to checkpoints or evaluation: out of samples/s."""
        spent = time.perf_counter() - since
        self.excluded_s += spent
        self.paused_s += spent

    def compiled(self, loss: torch.Tensor, t0: float) -> None:
        """The first step under ``--compile`` compiled the model: its time is logged apart and kept out of
        the throughput windows, the step split and the summary's samples/s."""
        loss.item()  # the compiled kernels have run
        self.compile_s = time.perf_counter() - t0
        self.clock.read()  # a window of its own, dropped
        self.window_start, self.window_steps = time.perf_counter(), -1  # log_step counts this step: 0
        self.metrics.log({"event": "compile", "step": self.step, "seconds": round(self.compile_s, 3)},
                         f"compiled the model in {self.compile_s:.1f}s (the first step; not in samples/s)")

    def train_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over ``--grad-accum`` micro-batches; the mean loss, still on the device."""
        cfg, k = self.cfg, self.cfg.optim.grad_accum
        self.clock.begin(self.step)
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        micro = step.micro_batches(batches, k, cfg, self.info, self.step, self.clock)
        loss = step.accumulate_gradients(self.model, micro, k, self.criterion, self.info.device, cfg.amp,
                                         self.scaler, sync=not cfg.harness.bench_no_sync, clock=self.clock)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if cfg.harness.slow_rank == self.info.rank:
            time.sleep(cfg.harness.slow_rank_delay)  # tests: a straggler, slow in its own compute
        self.clock.step_done()
        self.scheduler.step()
        self.step += 1
        return loss

    def log_step(self, epoch: int, loss: torch.Tensor, step_time: float) -> None:
        """Every ``--log-every`` steps (and the first and last): the only place the loss is read back.

        Besides loss and throughput, the window's step split (``stepclock``): milliseconds per step
        spent waiting for data (``data_ms``), computing (``compute_ms``) and waiting on communication
        the backward did not hide (``comm_ms``), means over the ranks; and the device's peak memory.
        """
        self.window_steps += 1
        s = self.step
        if not (s % self.cfg.output.log_every == 0 or s == self.total_steps or s == 1 or s - 1 == self.resumed_at):
            return  # (a resumed run's first step is logged: how long the way back took shows)
        split = self.clock.read()
        parts = (split.data_ms, split.compute_ms, split.comm_ms) if split else ()
        mean_loss, *means = mean_over_ranks(self.info, loss, *parts)
        self.last_loss = mean_loss
        elapsed = time.perf_counter() - self.window_start - self.excluded_s
        rate = self.samples_per_step * self.window_steps / elapsed if elapsed > 0 and self.window_steps > 0 else None
        lr = self.scheduler.get_last_lr()[0]
        record: dict[str, object] = {
            "event": "step", "step": s, "total_steps": self.total_steps, "epoch": epoch, "loss": mean_loss, "lr": lr,
            "step_time": step_time, "world_size": self.info.world_size}
        if rate is not None:  # none for a window that held only the compiling step
            record["samples_per_s"] = rate
        if means:
            record.update(zip(("data_ms", "compute_ms", "comm_ms"), (round(v, 3) for v in means)))
        if (peak := peak_memory_mb(self.info.device)) is not None:
            record["peak_memory_mb"] = peak
        self.metrics.log(
            record, f"epoch {epoch} step {s}/{self.total_steps} loss {mean_loss:.4f} lr {lr:.4g}"
            + (f" {rate:.0f} samples/s (global)" if rate is not None else "")
            + (f", step: {split_text(means)}" if means else ""),
        )
        self.window_start, self.window_steps, self.excluded_s = time.perf_counter(), 0, 0.0

    @property
    def samples_per_step(self) -> int:
        return self.cfg.optim.batch_size * self.cfg.optim.grad_accum * self.info.world_size

    def summary(self, ev: dict[str, float | int | None], preempted: bool, trained: int, run_time: float) -> dict[str, object]:
        cfg = self.cfg
        out: dict[str, object] = {
            "train_loss": self.last_loss, **ev, "steps": self.step, "epochs": cfg.optim.epochs,
            "world_size": self.info.world_size, "preempted": preempted, "dataset": cfg.data.dataset, "model": cfg.model,
            "samples_per_s": self.samples_per_step * trained / run_time if trained and run_time > 0 else None,
            "strategy": cfg.ddp.strategy, "amp": cfg.amp, "grad_compression": cfg.ddp.grad_compression,
            "bucket_cap_mb": cfg.ddp.bucket_cap_mb, "sync_bn": cfg.ddp.sync_bn, "compile": cfg.compile,
        }
        if self.compile_s is not None:
            out["compile_s"] = round(self.compile_s, 3)
        if cfg.model == "linear" and cfg.data.dataset == "linreg":
            lin = models.unwrap(self.model)
            assert isinstance(lin, torch.nn.Linear)  # models.build: linreg's only model
            out["weight"] = float(lin.weight.detach().flatten()[0])
            out["bias"] = float(lin.bias.detach().flatten()[0])
        return out


def _int(value: object) -> int:
    """A number a checkpoint's command line recorded, as ``int()`` reads it."""
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"not a number: {value!r}")
    return int(value)


def resume_point(epoch: int, step_in_epoch: int, *, saved_samples_per_step: int, saved_steps_per_epoch: int,
                 samples_per_step: int) -> tuple[int, int]:
    """(epoch, steps into it) to resume at, on a world size whose step takes ``samples_per_step`` samples,
    from a checkpoint taken ``step_in_epoch`` steps of ``saved_samples_per_step`` into ``epoch``.

    An epoch's order is one permutation on any world size (DistributedSampler: seeded by seed + epoch,
    rank r takes every world-size-th index from r), and each step's batches across the ranks are the
    next samples_per_step of it: the place in the epoch is a number of samples. It is rounded down to a
    whole step here, so at most one step's samples are seen twice, none skipped. A checkpoint at an
    epoch's end resumes at the next epoch's start."""
    if step_in_epoch >= saved_steps_per_epoch:
        return epoch + 1, 0
    if samples_per_step == saved_samples_per_step:
        return epoch, step_in_epoch
    return epoch, step_in_epoch * saved_samples_per_step // samples_per_step


def follow_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, optimizer: torch.optim.Optimizer,
                    base_lrs: list[float], step: int) -> None:
    """The schedule as if this world size had run from the start: at ``step`` of its own length, from
    ``base_lrs`` (this world size's rates), not the saved schedule's place and rates."""
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["initial_lr"] = base
    scheduler.base_lrs = list(base_lrs)
    scheduler.last_epoch = step
    lrs: list[float | torch.Tensor] = [base * fn(step) for base, fn in zip(base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reads


def restart_count() -> int:
    """How many times ddpjob brought this run back after a lost node (``DDPJOB_RESTART_COUNT``, 0 when
    not set)."""
    value = os.environ.get("DDPJOB_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def fused_sgd(device: torch.device) -> dict[str, bool]:
    """SGD's one-kernel implementation where the device has it (CUDA): one launch per step instead of a
    few per parameter group. Elsewhere torch's default."""
    return {"fused": True} if device.type == "cuda" else {}


def peak_memory_mb(device: torch.device) -> float | None:
    """The device's peak allocated memory since the last call, in MiB (the GPU's; None on the CPU)."""
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    torch.cuda.reset_peak_memory_stats(device)
    return round(peak, 1)


def split_text(means: list[float]) -> str:
    """``data 3% compute 85% comm 12%`` of the window's step split (for the log line; the trainer may not
    import launcher.core, whose stepsplit writes the same words for ddpjob's commands)."""
    total = sum(means)
    if total <= 0:
        return "-"
    return " ".join(f"{name} {100 * v / total:.0f}%" for name, v in zip(("data", "compute", "comm"), means))


def train(cfg: TrainConfig, info: DistInfo) -> dict[str, object]:
    """Run (or resume) training; returns the summary rank 0 writes to summary.json."""
    return Trainer(cfg, info).run()
