"""Which rank holds the others back: judged by the first node's watch (``shared.heartbeat``) at each
interval from every node's vitals (``shared.vitals``). Standard library only.

In data-parallel training every rank takes the same time per step (each waits for the others at the
all-reduce), so a step's length says nothing of who is slow. Its parts do: the reference trainer
reports each rank's own work per step, data plus compute (``data_ms``, ``compute_ms``), apart from the
time it waits on its peers (``comm_ms``, see ``launcher.train.stepclock``). A rank whose own work
stays well above the median of the others' (``FACTOR`` times, and ``MIN_EXTRA_MS`` more) for
``SAMPLES`` samples in a row is a straggler: named with its node, by how much, and what it is short
of (data if most of its extra time is waiting for batches, else compute); the others meanwhile wait
on it, which their larger ``comm_ms`` shows.

A program that reports no step times (not ddpjob's trainer) is judged by what its node's sampler
measures of each rank's process instead, with the same ``SAMPLES`` in a row, and the message says
what was measured, not more:

- CPU: a rank whose CPU use stays ``USE_FACTOR`` times the others' median and ``USE_APART`` points
  above it does more work per step than they do; in lockstep training (every rank waits for the
  others in each collective) the others wait on it. Under Gloo a rank waiting in a collective blocks
  and uses little CPU, so the busy one stands out. The opposite is not judged: a rank slowed by
  sleeping, by I/O or by a lock uses as little CPU as its peers waiting for it, so CPU use cannot
  tell it from them. The measure is the rank's own process (all its threads), not its DataLoader
  worker processes, so a rank slowed by its data workers is not seen either.
- GPU (where ``nvidia-smi`` lists the rank's process, each rank on a GPU of its own): only a rank
  whose GPU is well *less* busy than the others' (their median ``USE_FACTOR`` times its use and
  ``USE_APART`` points more) is named: its time goes to work off its GPU (data, CPU work, I/O).
  The opposite is not judged: NCCL's kernels keep a GPU busy while its rank waits for its peers, so a
  waiting rank's GPU reads as busy as a working one's.
- Frames (where py-spy is installed on the node: ``stacks.FrameSampler``): each rank's Python stack is
  read every few seconds without pausing it, and each sample says whether its main thread waited on its
  peers (in ``torch.distributed``, or in DDP's backward) or where in the program it was. A rank that
  waited in at most ``FRAMES_ALONE`` of its last samples while every other rank waited in at least
  ``FRAMES_WAIT`` of theirs is the one they wait for, whatever it spends its time on (a sleep, I/O, a
  lock, CPU or GPU work): named with the frame it was in most.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from collections.abc import Mapping, Sequence

    # A JSON object as the watch holds it (a node's record, a rank's sample or step report), read here.
    Seen = Mapping[str, object]
    # A rank's place in a judgement: (rank, its node's record, its sample) or, with its step report,
    # (rank, its node's record, (own work, data, compute) in ms, the report).
    Ranked = tuple[int, Seen, Seen]
    Stepped = tuple[int, Seen, tuple[float, float, float], Seen]

FACTOR = 1.5
MIN_EXTRA_MS = 5.0
SAMPLES = 3
FRESH_S = 60.0  # a step report (or a node's sample) older than this is no longer the rank's pace
USE_FACTOR = 2.0  # CPU or GPU use this many times apart from the others' median ...
USE_APART = 25.0  # ... and this many percentage points apart
FRAMES_MIN = 4  # samples a rank's place is judged from, at least
FRAMES_ALONE, FRAMES_WAIT = 0.25, 0.6  # the share of its samples a rank waited on its peers: the one, the others
_GONE = ("T", "t", "Z", "X")  # stopped (the stall rule's), zombie or ended: no pace to judge


def _own(steps: Seen) -> tuple[float, float, float] | None:
    """(own work, data, compute) per step in ms, from a rank's step report."""
    try:
        data, compute = to_float(steps["data_ms"]), to_float(steps["compute_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return data + compute, data, compute


def to_float(value: object) -> float:
    """``float(value)`` for what it takes (a number, or text of one); TypeError for anything else."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"not a number: {type(value).__name__}")


def _obj(value: object) -> Seen:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _where(rec: Seen) -> str:
    return f"node {rec['node']}" + (f" ({rec['host']})" if rec.get("host") else "")


def number(value: object) -> float | None:
    """``value`` as a float if it is a number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class Straggle:
    """The stragglers of one run; ``judge`` at each of the watch's intervals."""

    def __init__(self) -> None:
        self._apart: dict[tuple[str, int], tuple[int, float]] = {}  # (rule, rank) -> (samples in a row apart, since)
        self._seen: set[tuple[str, int]] = set()  # what was apart in this judgement

    def judge(self, nodes: Sequence[Seen], now: float) -> list[dict[str, object]]:
        """The stragglers among the ranks of ``nodes`` (the watch's records of its nodes, each with its
        ``vitals``), each a record as ``watch.json``'s ``stragglers`` hold it."""
        ranks: list[Stepped] = []
        plain: list[Ranked] = []  # ranks without step reports
        for rec in nodes:
            vitals = rec.get("vitals")
            fresh = isinstance(vitals, dict) and now - (number(vitals.get("t")) or now) < FRESH_S
            for r in _list(vitals.get("ranks")) if isinstance(vitals, dict) else []:
                if not isinstance(r, dict):
                    continue
                steps = r.get("steps")
                parts = _own(steps) if isinstance(steps, dict) else None
                rank = r.get("rank")
                if not isinstance(rank, int):
                    continue
                if parts is not None and isinstance(steps, dict) and now - to_float(steps.get("t") or 0) < FRESH_S:
                    ranks.append((rank, rec, parts, steps))
                elif parts is None and fresh and r.get("state") not in _GONE:
                    plain.append((rank, rec, r))
        self._seen = set()
        out = sorted(self._by_steps(ranks, now), key=lambda s: -(number(s.get("own_ms")) or 0.0))
        named = {s["rank"] for s in out}
        out += [s for s in self._by_frames(plain, now) if s["rank"] not in named]
        named |= {s["rank"] for s in out}
        out += sorted((s for s in self._by_use(plain, now) if s["rank"] not in named), key=lambda s: -(number(s.get("apart")) or 0.0))
        self._apart = {k: v for k, v in self._apart.items() if k in self._seen}
        return out

    def _count(self, rule: str, rank: int, now: float) -> tuple[bool, float]:
        """One more sample apart for ``rank`` under ``rule``: (whether it makes ``SAMPLES`` in a row, since)."""
        self._seen.add((rule, rank))
        count, since = self._apart.get((rule, rank), (0, now))
        self._apart[(rule, rank)] = (count + 1, since)
        return count + 1 >= SAMPLES, since

    def _by_steps(self, ranks: list[Stepped], now: float) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for rank, rec, (own, data, _compute), _steps in ranks:
            others = [o for k, _, o, _ in ranks if k != rank]
            if not others:
                continue
            mid, mid_data = statistics.median(o[0] for o in others), statistics.median(o[1] for o in others)
            if own < FACTOR * mid or own - mid < MIN_EXTRA_MS:
                continue
            named, since = self._count("steps", rank, now)
            if not named:
                continue
            short = "data (waiting for its batches)" if data - mid_data > (own - mid) / 2 else "compute (its own work is slower)"
            comm = statistics.median(to_float(s.get("comm_ms") or 0) for k, _, _, s in ranks if k != rank)
            out.append({"rank": rank, "node": rec["node"], "host": rec.get("host"), "since": since,
                        "own_ms": round(own, 1), "others_ms": round(mid, 1), "short_of": short.split(" ")[0],
                        "message": f"rank {rank} on {_where(rec)} is the slowest: {own:.0f} ms of its own work a step "
                                   f"against {mid:.0f} ms for the others (x{own / max(mid, 0.1):.1f}), short of {short}; "
                                   f"the others wait on it ({comm:.0f} ms a step)"})
        return out

    def _by_use(self, ranks: list[Ranked], now: float) -> list[dict[str, object]]:
        """The rules for a program without step reports (see the module): more CPU, or a less busy GPU."""
        out: list[dict[str, object]] = []
        cpus = {rank: c for rank, _, r in ranks if (c := number(r.get("cpu"))) is not None}
        gpus = _own_gpus(ranks)
        for rank, rec, _r in ranks:
            others = [c for k, c in cpus.items() if k != rank]
            if rank in cpus and others:  # more CPU than the others
                cpu, mid = cpus[rank], statistics.median(others)
                if cpu >= USE_FACTOR * mid and cpu - mid >= USE_APART:
                    out += self._use_apart("cpu", rank, rec, cpu, mid, now, "compute",
                                           f"uses {cpu:.0f}% CPU against {mid:.0f}% for the others: it works the most, "
                                           "and in lockstep training the others wait on it")
            others = [u for k, u in gpus.items() if k != rank]
            if rank in gpus and others:  # a less busy GPU than the others'
                util, mid = gpus[rank], statistics.median(others)
                if mid >= USE_FACTOR * util and mid - util >= USE_APART:
                    out += self._use_apart("gpu", rank, rec, util, mid, now, "work off its GPU",
                                           f"keeps its GPU {util:.0f}% busy against {mid:.0f}% for the others: its "
                                           "time goes to work off the GPU (data, CPU work, I/O) while the others "
                                           "wait on it")
        return out

    def _by_frames(self, ranks: list[Ranked], now: float) -> list[dict[str, object]]:
        """The frames rule (see the module): the rank the others keep waiting for."""
        share: dict[int, tuple[float, Seen, Seen, float]] = {}
        for rank, rec, r in ranks:
            f = r.get("frames")
            n = number(f.get("n")) if isinstance(f, dict) else None
            if isinstance(f, dict) and n is not None and n >= FRAMES_MIN:
                share[rank] = ((number(f.get("wait")) or 0.0) / n, f, rec, n)
        out: list[dict[str, object]] = []
        for rank, (alone, f, rec, n) in share.items():
            others = [w for k, (w, _, _, _) in share.items() if k != rank]
            if not others or alone > FRAMES_ALONE or min(others) < FRAMES_WAIT:
                continue
            named, since = self._count("frames", rank, now)
            if not named:
                continue
            at = f.get("at") or "its own code"
            out.append({"rank": rank, "node": rec["node"], "host": rec.get("host"), "since": since, "measured": "frames",
                        "at": at, "short_of": "its own work",
                        "message": f"rank {rank} on {_where(rec)} is the one the others wait for: its stack was in {at} "
                                   f"(waiting on its peers in {alone:.0%} of its last {int(n)} samples, the others "
                                   f"in {min(others):.0%} or more) (judged by where each rank's Python stack was: py-spy)"})
        return out

    def _use_apart(self, rule: str, rank: int, rec: Seen, use: float, mid: float, now: float,
                   short_of: str, what: str) -> list[dict[str, object]]:
        """Rank ``rank`` apart under ``rule`` ("cpu" or "gpu") once more: its straggler record once it has
        been ``SAMPLES`` in a row, else nothing yet."""
        named, since = self._count(rule, rank, now)
        if not named:
            return []
        return [{"rank": rank, "node": rec["node"], "host": rec.get("host"), "since": since, "measured": rule,
                 "use": use, "others_use": mid, "apart": abs(use - mid), "short_of": short_of,
                 "message": f"rank {rank} on {_where(rec)} {what} (judged by {rule.upper()} use: the program reports "
                            "no step times)"}]


def _own_gpus(ranks: list[Ranked]) -> dict[int, float]:
    """Each rank's GPU use %, for the ranks that have a GPU of their own (a GPU's use is the device's,
    so ranks sharing one cannot be told apart)."""
    users: dict[tuple[object, object], list[int]] = {}  # (node, GPU) -> its ranks
    util: dict[int, float] = {}
    for rank, rec, r in ranks:
        gpu = _obj(r.get("gpu"))
        if gpu.get("gpu") is None:
            continue
        users.setdefault((rec["node"], gpu["gpu"]), []).append(rank)
        devices = _list(_obj(rec.get("vitals")).get("gpus"))
        use = next((number(d.get("util")) for d in devices if isinstance(d, dict) and d.get("index") == gpu["gpu"]), None)
        if use is not None:
            util[rank] = use
    return {rank: u for rank, u in util.items() if all(len(v) == 1 for k, v in users.items() if rank in v)}
