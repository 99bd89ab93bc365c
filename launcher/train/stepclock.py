"""Where a training step's time goes: waiting for data, computing, and waiting on communication that the
backward pass did not hide.

The loop marks each measured step in order: ``start``; ``data`` once a micro-batch is ready on the
device; ``bucket`` each time DDP hands a gradient bucket to its all-reduce (a communication hook,
``parallel.wrap``); ``backward`` when the backward pass returns, DDP having waited for every
all-reduce; ``done`` after the optimizer step. The time between two marks belongs to the later one:

- ``data``: data (fetching, copying and preparing the batch, or waiting for it);
- ``bucket``, ``done``, and ``backward`` with no bucket before it: compute;
- ``backward`` after a bucket: communication not hidden, the all-reduces still running once the last
  gradient was ready (the last bucket is ready exactly when the backward's compute ends).

On a GPU the marks are CUDA events in the compute stream, so the parts are the device's time, waiting
on the host included, and no mark syncs the host: ``read`` waits for the last mark only where the loop
reads the loss anyway. Events cost a few microseconds of host time each, which a small model that is
bound by the host notices, so a GPU measures every ``GPU_EVERY``-th step; a CPU measures each step
with ``perf_counter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

GPU_EVERY = 4
PARTS = ("data", "compute", "comm")


@dataclass(frozen=True)
class Split:
    """Per-step means over the measured steps of a window, in milliseconds."""

    data_ms: float
    compute_ms: float
    comm_ms: float
    steps: int


class StepClock:
    """Marks of the steps measured since the last ``read``; see the module's docstring."""

    def __init__(self, device: torch.device, *, enabled: bool = True,
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.cuda = device.type == "cuda"
        self.now = now  # the CPU's clock (tests give their own)
        self.every = GPU_EVERY if self.cuda else 1
        self.enabled = enabled
        self.active = False
        self._marks: list[tuple[str, float | torch.cuda.Event]] = []
        self._steps = 0
        self._bucket = False
        self._spare: list[torch.cuda.Event] = []  # events read already, recorded again

    def begin(self, step: int) -> None:
        """A step starts (``step``: the number of steps done before it)."""
        self.active = self.enabled and step % self.every == 0
        if self.active:
            self._steps += 1
            self._mark("start")

    def data_ready(self) -> None:
        self._bucket = False
        self._mark("data")

    def bucket_ready(self) -> None:
        """DDP's communication hook: a gradient bucket goes to its all-reduce (autograd's thread)."""
        if self.active:
            self._bucket = True
            self._mark("bucket")

    def backward_done(self) -> None:
        self._mark("comm" if self._bucket else "compute")

    def step_done(self) -> None:
        self._mark("compute")
        self.active = False

    def _mark(self, label: str) -> None:
        if not self.active:
            return
        if self.cuda:
            event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._marks.append((label, event))
        else:
            self._marks.append((label, self.now()))

    def read(self) -> Split | None:
        """The window's split, and a new window; None when no step was measured in it. On a GPU this
        waits for the last marked step's work."""
        marks, steps = self._marks, self._steps
        self._marks, self._steps = [], 0
        if not steps or not marks:
            return None
        last = marks[-1][1]
        if isinstance(last, torch.cuda.Event):
            last.synchronize()
        totals = dict.fromkeys(PARTS, 0.0)
        prev: float | torch.cuda.Event | None = None
        for label, stamp in marks:
            if label != "start" and prev is not None:
                totals["compute" if label in ("bucket", "compute") else label] += _elapsed_ms(prev, stamp)
            prev = stamp
        self._spare = [e for _, e in marks if isinstance(e, torch.cuda.Event)][:64]
        return Split(totals["data"] / steps, totals["compute"] / steps, totals["comm"] / steps, steps)


def _elapsed_ms(a: float | torch.cuda.Event, b: float | torch.cuda.Event) -> float:
    if isinstance(a, torch.cuda.Event) and isinstance(b, torch.cuda.Event):
        return float(a.elapsed_time(b))
    assert isinstance(a, float) and isinstance(b, float)
    return (b - a) * 1000.0
