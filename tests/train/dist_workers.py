"""Functions run in real gloo processes by the trainer tests (torch.multiprocessing.spawn imports them by name)."""

import copy
import os

import torch
import torch.distributed as dist
from torch import nn

from launcher.train import cli, distcore, loop, models, parallel, step
from launcher.train.distcore import DistInfo
from launcher.train.metrics import write_summary
from launcher.train.stepclock import StepClock

MICRO, K = 4, 3  # samples per micro-batch, micro-batches per step


class CountingClock(StepClock):
    """The trainer's step clock, counting the buckets its DDP hook hands to the all-reduce."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.buckets = 0

    def bucket_ready(self) -> None:
        self.buckets += 1


def accumulate_with_no_sync(rank: int, world: int, store: str) -> None:
    """Gradient accumulation under the trainer's DDP: one all-reduce per step, the global batch's gradient."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # same model and data on every rank
        base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        x, y = torch.randn(world * K * MICRO, 8), torch.randint(0, 3, (world * K * MICRO,))
        ref = copy.deepcopy(base)
        nn.functional.cross_entropy(ref(x), y).backward()  # the whole global batch in one process

        cfg = cli.parse(["--grad-accum", str(K)])  # DDP, 25 MiB buckets, no compression
        clock = CountingClock()
        model = parallel.wrap(base, cfg, DistInfo(rank, world, rank, torch.device("cpu"), True), clock)
        mine = slice(rank * K * MICRO, (rank + 1) * K * MICRO)
        micro = zip(x[mine].split(MICRO), y[mine].split(MICRO))
        step.accumulate_gradients(model, micro, K, nn.CrossEntropyLoss(), torch.device("cpu"), "off", None)
        # The model fits one bucket: with no_sync on the first K-1 micro-batches it is reduced once, not K times.
        assert clock.buckets == 1, f"rank {rank}: {clock.buckets} buckets all-reduced, expected 1 (one per step)"
        for got, want in zip((p.grad for p in models.unwrap(model).parameters()), (p.grad for p in ref.parameters())):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    finally:
        # Leave together, as the trainer does (distcore.teardown): a rank that destroys its group
        # while the other still uses it can abort that one (SIGABRT, seen once in a full run).
        dist.barrier()
        dist.destroy_process_group()
    _exit_without_teardown()


def _exit_without_teardown() -> None:
    """A rank that passed leaves as the trainer does (launcher.train): output flushed, then exit 0 without
    Python's final teardown, where torch's Gloo threads can still abort the process ("terminate called
    without an active exception", SIGABRT: seen in a full CI run after every check had passed)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_each(rank: int, world: int, port: int, runs: dict) -> None:
    """The trainer's command line and loop, several runs in one process group: {output_dir: argv}."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                       "RANK": str(rank), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"})
    info = distcore.setup()
    try:
        for out, argv in runs.items():
            summary = loop.train(cli.parse([*argv, "--output-dir", out]), info)
            if info.is_main:
                write_summary(out, summary)
    finally:
        distcore.teardown(info)
    _exit_without_teardown()
