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
"""

from __future__ import annotations

import statistics
from typing import Any

FACTOR = 1.5
MIN_EXTRA_MS = 5.0
SAMPLES = 3
FRESH_S = 60.0  # a step report older than this is no longer the rank's pace


def _own(steps: dict[str, Any]) -> tuple[float, float, float] | None:
    """(own work, data, compute) per step in ms, from a rank's step report."""
    try:
        data, compute = float(steps["data_ms"]), float(steps["compute_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return data + compute, data, compute


class Straggle:
    """The stragglers of one run; ``judge`` at each of the watch's intervals."""

    def __init__(self) -> None:
        self._apart: dict[int, tuple[int, float]] = {}  # rank -> (samples in a row apart, since)

    def judge(self, nodes: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        ranks: list[tuple[int, dict[str, Any], tuple[float, float, float], dict[str, Any]]] = []
        for rec in nodes:
            vitals = rec.get("vitals")
            for r in vitals.get("ranks") or [] if isinstance(vitals, dict) else []:
                steps = r.get("steps")
                parts = _own(steps) if isinstance(steps, dict) else None
                if parts is not None and isinstance(steps, dict) and isinstance(r.get("rank"), int) \
                        and now - float(steps.get("t") or 0) < FRESH_S:
                    ranks.append((r["rank"], rec, parts, steps))
        out, seen = [], set()
        for rank, rec, (own, data, _compute), _steps in ranks:
            others = [o for k, _, o, _ in ranks if k != rank]
            if not others:
                continue
            mid, mid_data = statistics.median(o[0] for o in others), statistics.median(o[1] for o in others)
            if own < FACTOR * mid or own - mid < MIN_EXTRA_MS:
                continue
            seen.add(rank)
            count, since = self._apart.get(rank, (0, now))
            self._apart[rank] = (count + 1, since)
            if count + 1 < SAMPLES:
                continue
            short = "data (waiting for its batches)" if data - mid_data > (own - mid) / 2 else "compute (its own work is slower)"
            where = f"node {rec['node']}" + (f" ({rec['host']})" if rec.get("host") else "")
            comm = statistics.median(float(s.get("comm_ms") or 0) for k, _, _, s in ranks if k != rank)
            out.append({"rank": rank, "node": rec["node"], "host": rec.get("host"), "since": since,
                        "own_ms": round(own, 1), "others_ms": round(mid, 1), "short_of": short.split(" ")[0],
                        "message": f"rank {rank} on {where} is the slowest: {own:.0f} ms of its own work a step "
                                   f"against {mid:.0f} ms for the others (x{own / max(mid, 0.1):.1f}), short of {short}; "
                                   f"the others wait on it ({comm:.0f} ms a step)"})
        self._apart = {k: v for k, v in self._apart.items() if k in seen}
        return sorted(out, key=lambda s: -s["own_ms"])
