#!/usr/bin/env python3
"""Where the reference trainer's steps go, under torch.profiler; prints JSON and the profiler's tables.

Builds the trainer (``launcher.train.loop.Trainer``) as ``python -m launcher.train`` would from the given
options, runs ``--warmup`` steps, then profiles ``--steps`` steps (CPU and, where there is one, CUDA
activity). Reports per step: the wall time, the time the GPU spent in kernels (``gpu_busy``: kernel time
over wall time; well under 1 means the GPU waits, for the host or for data), the trainer's own step
split (``stepclock``), and the top operators by device time and by host time.

Usage: python tests/bench/gpu_profile.py [--steps 20] [--warmup 10] [--out DIR] -- TRAINER OPTIONS...
  e.g. python tests/bench/gpu_profile.py -- --dataset synthetic --model resnet18 --amp bf16 --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _device_us(event: Any) -> float:
    """An averaged event's own device time in microseconds (its name moved in torch 2.4)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", help="also write the JSON and the tables here")
    ap.add_argument("trainer", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from launcher.train import cli, distcore, loop

    argv = [a for a in args.trainer if a != "--"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cli.parse([*argv, "--output-dir", tmp, "--log-every", str(10**9)])
        info = distcore.setup()
        trainer = loop.Trainer(cfg, info)
        if (args.warmup + args.steps) * cfg.optim.grad_accum > len(trainer.batches):
            raise SystemExit(f"--train-size too small: {len(trainer.batches)} batches, "
                             f"{args.warmup + args.steps} steps wanted")
        batches = trainer.batches.epoch(0)
        cuda = info.device.type == "cuda"

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()

        for _ in range(args.warmup):
            trainer.train_step(batches)
        sync()
        trainer.clock.read()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(args.steps):
                trainer.train_step(batches)
            sync()
            wall = time.perf_counter() - start
        split = trainer.clock.read()
        # Without the profiler: what the same steps take when nobody watches.
        start = time.perf_counter()
        for _ in range(min(args.steps, len(trainer.batches) - args.warmup - args.steps)):
            trainer.train_step(batches)
        sync()
        plain_steps = min(args.steps, len(trainer.batches) - args.warmup - args.steps)
        plain = (time.perf_counter() - start) / plain_steps if plain_steps > 0 else None
    events = prof.key_averages()
    kernel_us = sum(_device_us(e) for e in events)
    result = {
        "benchmark": "gpu_profile", "trainer": argv, "device": str(info.device), "torch": torch.__version__,
        "steps": args.steps, "step_ms_profiled": round(wall / args.steps * 1000, 3),
        "step_ms_plain": round(plain * 1000, 3) if plain else None,
        "images_per_s_plain": round(cfg.optim.batch_size * cfg.optim.grad_accum / plain, 1) if plain else None,
        "gpu_busy": round(kernel_us / 1e6 / wall, 3) if cuda else None,
        "split_ms": None if split is None else {"data": round(split.data_ms, 3), "compute": round(split.compute_ms, 3),
                                                "comm": round(split.comm_ms, 3), "steps": split.steps},
        "batches": trainer.batches.where,
    }
    by_device = events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=20)
    by_host = events.table(sort_by="self_cpu_time_total", row_limit=20)
    text = json.dumps(result, indent=2)
    print(text)
    print(by_device if cuda else "")
    print(by_host)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(text + "\n")
        (out / "profile-ops.txt").write_text(f"by device time\n{by_device}\n\nby host time\n{by_host}\n")
    distcore.teardown(info)


if __name__ == "__main__":
    main()
