"""Command line of the reference DDP trainer: ``python -m launcher.train --help``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

EXIT_PREEMPTED = 0  # a preempted run checkpoints and exits cleanly; the next start resumes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher.train",
        description=(
            "Reference PyTorch DDP trainer. Run it under torchrun (ddpjob does that for you); without "
            "WORLD_SIZE in the environment it runs as one plain process. --strategy ddp "
            "(DistributedDataParallel, one process per GPU) is the recommended path; --strategy dp "
            "(single-process nn.DataParallel) exists to compare with the classic tutorials."
        ),
        epilog=(
            "Outputs (rank 0 only) in --output-dir: metrics.jsonl (one JSON line per logged step, "
            "checkpoint, eval, resume), checkpoint.pt (written atomically; a restart resumes from it "
            "automatically), summary.json at the end. SIGTERM or SIGUSR2 checkpoints at the next step "
            "and exits 0.\nExample: torchrun --nproc-per-node 2 -m launcher.train --dataset synthetic --model mlp"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = p.add_argument_group("data")
    d.add_argument("--dataset", choices=["cifar10", "synthetic", "linreg"], default="synthetic",
                   help="cifar10: CIFAR-10 python format under --data-dir; synthetic: learnable CIFAR-shaped "
                        "data; linreg: y = 2x + 3 + 0.1 noise (default: %(default)s)")
    d.add_argument("--data-dir", default=os.environ.get("DDPJOB_DATA_DIR", "./data"),
                   help="directory holding cifar-10-batches-py/ (default: $DDPJOB_DATA_DIR or ./data)")
    d.add_argument("--download", action="store_true", help="fetch CIFAR-10 if missing (checks the official MD5)")
    d.add_argument("--train-size", type=int, default=10000, help="samples for synthetic/linreg training (default: %(default)s)")
    d.add_argument("--eval-size", type=int, default=2000, help="samples for synthetic/linreg evaluation (default: %(default)s)")
    d.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per process (default 0: on few cores workers only add overhead)")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--model", choices=["linear", "mlp", "resnet18"], default="mlp", help="(default: %(default)s)")
    m.add_argument("--epochs", type=int, default=3)
    m.add_argument("--batch-size", type=int, default=64, help="per process (default: %(default)s)")
    m.add_argument("--eval-batch-size", type=int, default=256)
    m.add_argument("--lr", type=float, default=0.05, help="learning rate (default: %(default)s)")
    m.add_argument("--scale-lr", action="store_true", help="multiply --lr by the world size (linear scaling rule)")
    m.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps (use with --scale-lr)")
    m.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    m.add_argument("--momentum", type=float, default=0.9)
    m.add_argument("--weight-decay", type=float, default=0.0)
    m.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off",
                   help="mixed precision with torch.autocast; bf16 works on CPU, fp16 needs a GPU (GradScaler)")
    m.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (DDP no_sync on all but the last)")
    m.add_argument("--strategy", choices=["ddp", "dp"], default="ddp",
                   help="ddp: DistributedDataParallel (recommended); dp: single-process nn.DataParallel baseline")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    o = p.add_argument_group("outputs")
    o.add_argument("--output-dir", default=os.environ.get("DDPJOB_OUTPUT_DIR", "./outputs"),
                   help="metrics, checkpoints, summary (default: $DDPJOB_OUTPUT_DIR, set by ddpjob, or ./outputs)")
    o.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (always at epoch end)")
    o.add_argument("--log-every", type=int, default=10, help="log every N steps (default: %(default)s)")
    o.add_argument("--step-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slow steps down
    return p


def check(args: Any, p: argparse.ArgumentParser) -> None:
    for name in ("epochs", "batch_size", "grad_accum", "log_every", "train_size", "eval_size", "eval_batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.dataset == "linreg" and args.model != "linear":
        p.error("--dataset linreg needs --model linear")
    if args.strategy == "dp" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("--strategy dp is single-process; run it without torchrun (or use --strategy ddp)")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check(args, p)
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_run)(args)


def _run(args: Any) -> int:
    import torch

    from launcher.train import distcore, loop
    from launcher.train.data import DataError

    if args.amp == "fp16" and not torch.cuda.is_available():
        print("error: --amp fp16 needs a GPU; use --amp bf16 on CPU", file=sys.stderr)
        return 2
    loop.install_signal_handlers()
    info = distcore.setup()
    # The one print on every rank: a wrong rank, world size or endpoint shows in each node's log.
    import socket

    print(
        f"rank {info.rank}/{info.world_size} (local rank {info.local_rank}) on {socket.gethostname()}, "
        f"device {info.device}, rendezvous {os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}",
        flush=True,
    )
    try:
        summary = loop.train(args, info)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if info.is_main:
        loop.write_summary(args.output_dir, summary)
        print(
            f"done: {summary['steps']} steps, eval loss {summary['eval_loss']:.4f}"
            + (f", accuracy {summary['eval_accuracy']:.4f}" if summary["eval_accuracy"] is not None else "")
            + f" on {summary['eval_samples']} samples, world size {summary['world_size']}",
            flush=True,
        )
    distcore.teardown(info)
    return EXIT_PREEMPTED if summary["preempted"] else 0
