#!/usr/bin/env python3
"""Trainer scaling benchmark; prints JSON.

For mlp and resnet18 on synthetic data: global samples/s of 1 process versus 2 DDP processes
(gloo on CPU, nccl where GPUs exist), and the scaling efficiency = rate(2) / (2 * rate(1)).
On a CPU-only machine both processes share the same cores, so efficiency well below 1 is the
expected, honest result (see ../shared/reference/perf-cpu.md): DDP pays for gradient sync and
gains no compute. With 2+ GPUs it also compares --strategy dp with ddp.

Usage: python tests/bench/train_scaling.py [--steps 40] [--models mlp,resnet18]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(model: str, nproc: int, steps: int, batch: int, strategy: str = "ddp", threads: int | None = None) -> float:
    """Global samples/s reported by the trainer's summary.json."""
    with tempfile.TemporaryDirectory() as out:
        train_args = ["-m", "launcher.train", "--dataset", "synthetic", "--model", model, "--batch-size", str(batch),
                      "--train-size", str(batch * nproc * steps), "--eval-size", "64", "--epochs", "1",
                      "--max-steps", str(steps), "--log-every", str(steps), "--strategy", strategy, "--output-dir", out]
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        if nproc == 1:
            cmd = [sys.executable, *train_args]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *train_args]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads((Path(out) / "summary.json").read_text())["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--models", default="mlp,resnet18")
    args = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    cores = os.cpu_count() or 1
    results = {"benchmark": "train_scaling", "device": "cuda" if gpus else "cpu", "gpus": gpus, "cpu_count": cores,
               "backend": "nccl" if gpus else "gloo", "models": {}}
    for model in args.models.split(","):
        steps = args.steps if model == "mlp" else max(4, args.steps // 8)
        batch = 64
        one = run(model, 1, steps, batch, threads=cores if not gpus else None)
        two = run(model, 2, steps, batch, threads=max(1, cores // 2) if not gpus else None)
        entry = {"steps": steps, "batch_per_process": batch, "samples_per_s_1proc": round(one, 1),
                 "samples_per_s_2proc_ddp": round(two, 1), "scaling_efficiency": round(two / (2 * one), 3),
                 "speedup": round(two / one, 3)}
        if gpus > 1:
            entry["samples_per_s_dp"] = round(run(model, 1, steps, batch * gpus, strategy="dp"), 1)
        results["models"][model] = entry
    if not gpus:
        results["note"] = ("CPU only: both DDP processes share the same cores, so 2 processes cannot beat 1 "
                           "process using all cores; the gap is the cost of gradient all-reduce.")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
