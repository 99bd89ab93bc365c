"""Why a job is slow, in one line: the step split a training program writes on its metrics lines.

The reference trainer writes, on each logged step line, where its steps' time went over the window
(milliseconds per step, means over the ranks)::

    {"step": 120, ..., "data_ms": 0.4, "compute_ms": 31.2, "comm_ms": 9.8, "peak_memory_mb": 5120.0}

``data_ms``: waiting for the batch (loading, copying, preparing it); ``compute_ms``: forward, backward
and optimizer; ``comm_ms``: waiting on the gradient all-reduce after the backward's compute had ended
(communication the backward did not hide). Any program may write the same keys. ``status``, ``wait``,
``results`` and the dashboard show the shares, and one sentence of advice when waiting for data or for
the network takes ``BOUND_SHARE`` of the step or more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SPLIT_KEYS = ("data_ms", "compute_ms", "comm_ms")
MEMORY_KEY = "peak_memory_mb"
BOUND_SHARE = 0.3

ADVICE = {
    "data": ("data-bound: {pct}% of each step waits for its batch; keep the data set in memory or on the GPU "
             "when it fits (the reference trainer does), else add loader workers (--num-workers) or read from "
             "faster storage"),
    "comm": ("communication-bound: {pct}% of each step waits for the gradient all-reduce after the backward "
             "pass (on the network, or on a slower rank: ranks sharing a machine's cores wait on each other); "
             "try a larger batch per process or --grad-accum, --grad-compression bf16, a larger "
             "--bucket-cap-mb, and check the link between nodes (ddpjob doctor)"),
}


@dataclass(frozen=True)
class StepSplit:
    """Milliseconds per step waiting for data, computing and waiting on communication not hidden."""

    data_ms: float
    compute_ms: float
    comm_ms: float

    @classmethod
    def of(cls, record: Mapping[str, object]) -> StepSplit | None:
        """The split on a metrics line (or a progress record), or None when it has none."""
        values = [record.get(k) for k in SPLIT_KEYS]
        numbers = [float(v) for v in values if is_number(v)]  # type: ignore[arg-type]  # is_number checked it
        if len(numbers) != len(SPLIT_KEYS) or min(numbers) < 0:
            return None
        split = cls(*numbers)
        return split if split.total > 0 else None

    @classmethod
    def mean(cls, splits: Iterable[StepSplit]) -> StepSplit | None:
        """The mean of several windows' splits (a whole run's), or None of none."""
        got = list(splits)
        if not got:
            return None
        n = len(got)
        return cls(sum(s.data_ms for s in got) / n, sum(s.compute_ms for s in got) / n, sum(s.comm_ms for s in got) / n)

    @property
    def total(self) -> float:
        return self.data_ms + self.compute_ms + self.comm_ms

    def shares(self) -> dict[str, float]:
        return {"data": self.data_ms / self.total, "compute": self.compute_ms / self.total,
                "comm": self.comm_ms / self.total}

    def bound(self) -> str | None:
        """``data`` or ``comm`` when it takes ``BOUND_SHARE`` of the step or more (the larger of the two),
        else None (compute-bound: the GPU or CPU is doing the work, as it should)."""
        shares = self.shares()
        part = max(("data", "comm"), key=lambda k: shares[k])
        return part if shares[part] >= BOUND_SHARE else None

    def percents(self, sep: str = "/") -> str:
        """``3%/85%/12%``: the shares of data, compute and comm, in that order."""
        return sep.join(f"{round(100 * v)}%" for v in self.shares().values())

    def text(self) -> str:
        """``data 3% compute 85% comm 12%`` (and `` (data-bound)`` when one part dominates)."""
        shares = self.shares()
        words = " ".join(f"{k} {round(100 * v)}%" for k, v in shares.items())
        bound = self.bound()
        return words + (f" ({'communication' if bound == 'comm' else bound}-bound)" if bound else "")

    def advice(self) -> str | None:
        """One sentence of what to try, when waiting for data or the network dominates; None otherwise."""
        bound = self.bound()
        if bound is None:
            return None
        return advice_text(bound, str(round(100 * self.shares()[bound])))


def advice_text(bound: str, pct: str) -> str:
    """The advice for a ``bound`` part (``data`` or ``comm``) taking ``pct`` percent (``43``, ``41-44``)."""
    return ADVICE[bound].format(pct=pct)


def grouped_advice(runs: list[tuple[str, StepSplit | None]]) -> list[str]:
    """One line of advice per kind of bound among ``(label, split)`` runs, naming them (``every run``
    when all have it): a sweep whose runs all wait on the network gets one line, not one per run."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for label, split in runs:
        bound = split.bound() if split is not None else None
        if split is not None and bound is not None:
            groups.setdefault(bound, []).append((label, round(100 * split.shares()[bound])))
    out = []
    for bound, members in groups.items():
        pcts = sorted(p for _, p in members)
        pct = str(pcts[0]) if pcts[0] == pcts[-1] else f"{pcts[0]}-{pcts[-1]}"
        who = "every run" if len(members) == len(runs) > 1 else ", ".join(label for label, _ in members)
        out.append(f"{who}: {advice_text(bound, pct)}")
    return out


def run_split(curves: Mapping[str, list[tuple[int, float]]]) -> StepSplit | None:
    """A run's split from its metric curves (``service.results``): the mean over its logged windows, the
    first left out (start-up: the first step's allocations, a compile)."""
    points = [dict(curves.get(k, [])) for k in SPLIT_KEYS]
    steps = sorted(set(points[0]) & set(points[1]) & set(points[2]))
    windows = [StepSplit.of(dict(zip(SPLIT_KEYS, (p[s] for p in points)))) for s in steps]
    kept = [w for w in windows if w is not None]
    return StepSplit.mean(kept[1:] or kept)


def is_number(value: object) -> bool:
    """A finite int or float, not a boolean: what a metrics line's number must be to count."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
