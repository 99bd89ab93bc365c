#!/usr/bin/env python3
"""What the content scan for secrets (``secretscan``) adds to a build's context step (issue 47 item 6:
under 10%); prints JSON.

A generated folder of ordinary files (``--size-mb`` in all): code and configuration (text cut from the
installed sources of this Python's site-packages, in files of 2-60 KiB: 40% of the text's bytes),
CSV tables of numbers (text, 1-8 MiB each) and binary data (random bytes with NULs, 1-40 MiB each, so some are over the scan's 10 MiB
bound); ``--text-share`` is the share of bytes in text files (default 0.25: a training project's
code, configs and a little CSV beside its data; 1.0 is the worst case, all text). The context step
(``context.scan``: walk, read, hash, and the scan) is timed on it with the scan (``scan``) and without
(``bare``), alternating within each repeat (the order flipped every repeat), after one warm-up read so
the page cache holds the folder for both sides. ``cost_pct`` = 100 x (median of the per-repeat
ratios scan / bare - 1).

Usage: python tests/bench/context_scan_bench.py [--size-mb 400] [--text-share 0.25] [--repeats 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from launcher.service.imagebuild import context

CODE_SHARE = 0.4  # of the text's bytes: code and configuration; the rest CSV


def corpus(limit: int) -> bytes:
    """Up to ``limit`` bytes of real Python source from site-packages (ordinary code), repeated if short."""
    out: list[bytes] = []
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        out.append(data)
        total += len(data)
        if total >= limit:
            break
    text = b"".join(out) or b"def f(x):\n    return x + 1\n"
    return (text * (limit // len(text) + 1))[:limit]


def generate(root: Path, size: int, text_share: float, seed: int = 47) -> dict[str, int]:
    rng = random.Random(seed)
    text_budget = int(size * text_share)
    code = corpus(min(text_budget, 64 << 20) or 1)
    counts = {"code": 0, "csv": 0, "binary": 0}
    made = 0
    code_budget = int(text_budget * CODE_SHARE)
    made_code = 0
    while made < text_budget:  # code and configs, then CSV
        if made_code < code_budget:
            n = rng.randint(2 << 10, 60 << 10)
            start = rng.randrange(max(len(code) - n, 1))
            rel = f"src/pkg{counts['code'] % 40}/mod{counts['code']}.py"
            data, key = code[start:start + n], "code"
        else:
            n = rng.randint(1 << 20, 8 << 20)
            row = b",".join(str(rng.random()).encode() for _ in range(8)) + b"\n"
            rel, data, key = f"data/table{counts['csv']}.csv", row * (n // len(row)), "csv"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        counts[key] += 1
        made += len(data)
        made_code += len(data) if key == "code" else 0
    while made < size:
        n = min(rng.randint(1 << 20, 40 << 20), size - made)
        path = root / f"data/shard{counts['binary']}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" + os.urandom(n - 1))
        counts["binary"] += 1
        made += n
    return counts


def timed(root: Path, secrets: bool) -> tuple[float, context.Context]:
    t = time.perf_counter()
    ctx = context.scan(root, secrets=secrets)
    return time.perf_counter() - t, ctx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=400)
    ap.add_argument("--text-share", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep", help="generate into (and keep) this folder")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ctxbench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        counts = generate(root, args.size_mb << 20, args.text_share)
        timed(root, False)  # warm the page cache
        sides: dict[str, list[float]] = {"scan": [], "bare": []}
        ratios = []
        ctx = None
        for i in range(args.repeats):
            order = ["scan", "bare"] if i % 2 == 0 else ["bare", "scan"]
            took = {}
            for side in order:
                took[side], c = timed(root, side == "scan")
                ctx = c if side == "scan" else ctx
            for side in sides:
                sides[side].append(round(took[side], 3))
            ratios.append(took["scan"] / took["bare"])
        assert ctx is not None
        print(json.dumps({
            "bench": "context_scan", "size_mb": args.size_mb, "text_share": args.text_share, "files": counts,
            "entries": len(ctx.entries), "unscanned": len(ctx.unscanned), "findings": len(ctx.findings),
            "scan_s": sides["scan"], "bare_s": sides["bare"],
            "scan_median_s": statistics.median(sides["scan"]), "bare_median_s": statistics.median(sides["bare"]),
            "cost_pct": round(100 * (statistics.median(ratios) - 1), 1),
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        }, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
