"""Command line of the reference DDP trainer: ``python -m launcher.train --help``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import get_args

from launcher.train.config import Amp, Compression, Dataset, ModelName, Schedule, Strategy, TrainConfig, from_namespace

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
            "automatically, on the same or another world size: the sampler's place in the epoch and the "
            "learning-rate schedule follow), summary.json at the end; with --tensorboard also TensorBoard event files "
            "(events.out.tfevents.*) of the same metrics. SIGTERM or SIGUSR2 checkpoints within "
            "--stop-check-every steps (at the same step on every rank) and exits 0.\n"
            "Evaluation is exact: every sample once, with rank 0's weights and BatchNorm statistics, so "
            "it equals one process evaluating the checkpoint.\n"
            "Examples:\n"
            "  torchrun --nproc-per-node 2 -m launcher.train --dataset synthetic --model mlp\n"
            "  python -m launcher.train --eval-only --resume outputs/checkpoint.pt --output-dir eval "
            "--dataset cifar10"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _data_options(p.add_argument_group("data"))
    _model_options(p.add_argument_group("model and optimisation"))
    _ddp_options(p.add_argument_group(
        "DDP communication",
        "Gradients live in DDP's communication buckets (gradient_as_bucket_view), and DDP runs with "
        "static_graph when --grad-accum is 1 (its first iteration must sync every backward)."))
    _eval_only_options(p.add_argument_group("evaluation only"))
    _output_options(p.add_argument_group("outputs"))
    _harness_options(p)
    return p


def _data_options(d: argparse._ArgumentGroup) -> None:
    d.add_argument("--dataset", choices=get_args(Dataset), default="synthetic",
                   help="cifar10: CIFAR-10 python format under --data-dir; synthetic: learnable CIFAR-shaped "
                        "data; linreg: y = 2x + 3 + 0.1 noise (default: %(default)s)")
    d.add_argument("--data-dir", default=os.environ.get("DDPJOB_DATA_DIR", "./data"),
                   help="directory holding cifar-10-batches-py/ (default: $DDPJOB_DATA_DIR or ./data)")
    d.add_argument("--download", action="store_true", help="fetch CIFAR-10 if missing (checks the official MD5)")
    d.add_argument("--train-size", type=int, default=10000, help="samples for synthetic/linreg training (default: %(default)s)")
    d.add_argument("--eval-size", type=int, default=2000, help="samples for synthetic/linreg evaluation (default: %(default)s)")
    d.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per process (default 0: on few cores workers only add overhead)")


def _model_options(m: argparse._ArgumentGroup) -> None:
    m.add_argument("--model", choices=get_args(ModelName), default=None,
                   help="(default: mlp; with --eval-only, the checkpoint's model)")
    m.add_argument("--epochs", type=int, default=3)
    m.add_argument("--batch-size", type=int, default=64, help="per process (default: %(default)s)")
    m.add_argument("--eval-batch-size", type=int, default=256)
    m.add_argument("--lr", type=float, default=0.05, help="learning rate (default: %(default)s)")
    m.add_argument("--scale-lr", action="store_true", help="multiply --lr by the world size (linear scaling rule)")
    m.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps (use with --scale-lr)")
    m.add_argument("--schedule", choices=get_args(Schedule), default="cosine")
    m.add_argument("--momentum", type=float, default=0.9)
    m.add_argument("--weight-decay", type=float, default=0.0)
    m.add_argument("--amp", choices=get_args(Amp), default="off",
                   help="mixed precision with torch.autocast; bf16 works on CPU, fp16 needs a GPU (GradScaler)")
    m.add_argument("--compile", action="store_true",
                   help="torch.compile the model (needs a C compiler; the first step compiles: it is logged apart as "
                        "a 'compile' event and left out of the throughput windows). On a GPU convolutional models "
                        "also run channels_last with cudnn.benchmark, and SGD is fused, with or without it")
    m.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (DDP no_sync on all but the last)")
    m.add_argument("--strategy", choices=get_args(Strategy), default="ddp",
                   help="ddp: DistributedDataParallel (recommended); dp: single-process nn.DataParallel baseline")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")


def _ddp_options(c: argparse._ArgumentGroup) -> None:
    c.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="gradient bucket size in MiB: each bucket is all-reduced as soon as its gradients are "
                        "ready, overlapping the rest of the backward (default: %(default)s, DDP's own)")
    c.add_argument("--grad-compression", choices=get_args(Compression), default="none",
                   help="all-reduce gradients in 16 bits (DDP communication hook): half the bytes, slightly "
                        "noisier updates; the optimizer still steps in fp32 (default: %(default)s)")
    c.add_argument("--sync-bn", action="store_true",
                   help="SyncBatchNorm: batch statistics over the global batch (GPU only, as in torch). "
                        "Without it evaluation is still exact: ranks take rank 0's BatchNorm statistics first")
    c.add_argument("--stop-check-every", type=int, default=10,
                   help="ranks agree on a stop signal every N steps and at each epoch end; each agreement is "
                        "an all-reduce and a host sync (default: %(default)s)")


def _eval_only_options(e: argparse._ArgumentGroup) -> None:
    e.add_argument("--eval-only", action="store_true",
                   help="evaluate the checkpoint named by --resume on the eval split of the data options and "
                        "write summary.json (eval_loss, eval_accuracy, eval_samples) to --output-dir; no training. "
                        "Runs alone or under torchrun; pass the data options (and --seed for synthetic data) "
                        "the run was trained with")
    e.add_argument("--resume", metavar="CKPT",
                   help="with --eval-only: a checkpoint.pt, or the output directory that holds it (training "
                        "resumes from --output-dir's own checkpoint automatically)")


def _output_options(o: argparse._ArgumentGroup) -> None:
    o.add_argument("--output-dir", default=os.environ.get("DDPJOB_OUTPUT_DIR", "./outputs"),
                   help="metrics, checkpoints, summary (default: $DDPJOB_OUTPUT_DIR, set by ddpjob, or ./outputs)")
    o.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (always at epoch end)")
    o.add_argument("--checkpoint-seconds", type=_checkpoint_seconds, default=None, metavar="S|auto",
                   help="also checkpoint by time, so that a lost node costs at most this much work: auto (the "
                        "default) as often as checkpoints cost at most 2%% of the time, between every 10 s and "
                        "every 10 minutes; a number of seconds; 0: off. The ranks agree on it with their stop "
                        "check (--stop-check-every)")
    o.add_argument("--log-every", type=int, default=10, help="log every N steps: the only steps where the loss is read back from the device (default: %(default)s)")
    o.add_argument("--tensorboard", action="store_true",
                   help="also write what metrics.jsonl holds as TensorBoard event files in --output-dir "
                        "(tensorboard --logdir DIR; needs the tensorboard package: pip install 'ddpjob[tensorboard]')")


def _harness_options(p: argparse.ArgumentParser) -> None:
    """Options for tests and benchmarks only (config.HarnessConfig): they work but stay out of --help."""
    p.add_argument("--step-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slow steps down
    p.add_argument("--bench-no-sync", action="store_true", help=argparse.SUPPRESS)  # benchmark: DDP without gradient sync
    p.add_argument("--bench-data-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: a slow data loader
    p.add_argument("--bench-comm-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: a slow all-reduce
    p.add_argument("--bench-no-split", action="store_true", help=argparse.SUPPRESS)  # benchmark: no step split
    p.add_argument("--slow-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests: this rank is a straggler
    p.add_argument("--slow-rank-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # ... by this many seconds a step


def _checkpoint_seconds(text: str) -> float | None:
    from launcher.train.cadence import parse_seconds

    try:
        return parse_seconds(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto, or seconds from 0 (off) to 604800") from None


def check(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Refuse what argparse's types and choices let through (``p.error``: usage and exit 2)."""
    for name in ("epochs", "batch_size", "grad_accum", "log_every", "train_size", "eval_size", "eval_batch_size",
                 "stop_check_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.bucket_cap_mb <= 0:
        p.error("--bucket-cap-mb must be positive")
    if args.eval_only and not args.resume:
        p.error("--eval-only needs --resume CKPT (a checkpoint.pt or the directory holding it)")
    if args.resume and not args.eval_only:
        p.error("--resume is for --eval-only; training resumes from --output-dir's checkpoint.pt by itself")
    model = args.model if args.eval_only else args.model or "mlp"
    if args.dataset == "linreg" and model not in (None, "linear"):
        p.error("--dataset linreg needs --model linear")
    if args.tensorboard and importlib.util.find_spec("tensorboard") is None:
        p.error("--tensorboard needs the tensorboard package: pip install 'ddpjob[tensorboard]' (or pip install tensorboard)")
    if args.compile and not args.eval_only and not compiler():
        p.error("--compile needs a C compiler (torch.compile builds its kernels with one): install gcc "
                "(e.g. apt-get install gcc python3-dev), or set CC, or leave --compile out")
    if args.strategy == "dp" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("--strategy dp is single-process; run it without torchrun (or use --strategy ddp)")


def compiler() -> str | None:
    """The C compiler torch.compile would use ($CC, else cc, gcc or clang on PATH), or None."""
    import shutil

    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and (found := shutil.which(name)):
            return found
    return None


def parse(argv: list[str] | None = None) -> TrainConfig:
    """The checked config of a command line (``sys.argv[1:]`` when None); bad input exits 2 with usage."""
    p = parser()
    args = p.parse_args(argv)
    check(args, p)
    return from_namespace(args)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    from torch.distributed.elastic.multiprocessing.errors import record

    code = record(_run)(cfg)
    return 0 if code is None else code  # None: _run raised SystemExit(0)


def _run(cfg: TrainConfig) -> int:
    import torch

    from launcher.train import distcore, evaluation, loop, preempt
    from launcher.train.checkpoint import CheckpointError
    from launcher.train.data import DataError
    from launcher.train.metrics import write_summary

    if cfg.amp == "fp16" and not torch.cuda.is_available():
        print("error: --amp fp16 needs a GPU; use --amp bf16 on CPU", file=sys.stderr)
        return 2
    if cfg.ddp.sync_bn and not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print("error: --sync-bn needs GPUs (torch's SyncBatchNorm has no CPU kernels); evaluation is exact "
              "without it", file=sys.stderr)
        return 2
    preempt.install_signal_handlers()
    info = distcore.setup()
    # The one print on every rank: a wrong rank, world size or endpoint shows in each node's log.
    import socket

    print(
        f"rank {info.rank}/{info.world_size} (local rank {info.local_rank}) on {socket.gethostname()}, "
        f"device {info.device}, backend {info.backend}, "
        f"rendezvous {os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}",
        flush=True,
    )
    if info.note and info.local_rank == 0:
        print(f"note: {info.note}", flush=True)
    try:
        summary = evaluation.evaluate_checkpoint(cfg, cfg.eval_only, info) if cfg.eval_only else loop.train(cfg, info)
    except (DataError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if info.is_main:
        write_summary(cfg.output.output_dir, summary)
        head = f"evaluated {summary['checkpoint']}" if cfg.eval_only else f"done: {summary['steps']} steps"
        print(
            f"{head}, eval loss {summary['eval_loss']:.4f}"
            + (f", accuracy {summary['eval_accuracy']:.4f}" if summary["eval_accuracy"] is not None else "")
            + f" on {summary['eval_samples']} samples, world size {summary['world_size']}",
            flush=True,
        )
    distcore.teardown(info)
    return EXIT_PREEMPTED if summary.get("preempted") else 0
