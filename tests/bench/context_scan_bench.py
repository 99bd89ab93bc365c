#!/usr/bin/env python3
"""What the content scan for secrets (``secretscan``) adds to a build's context step (issue 47 item 6:
under 10%); prints JSON.

A generated folder of ordinary files (``--size-mb`` in all): code and configuration (text cut from the
installed sources of this Python's site-packages, in files of 2-60 KiB: 40% of the text's bytes),
CSV tables of numbers (text, 1-8 MiB each) and binary data (random bytes with NULs, 1-40 MiB each, so
some are over the scan's 10 MiB bound); ``--text-share`` is the share of bytes in text files (default
0.25: a training project's code, configs and a little CSV beside its data; 1.0 is the worst case, all
text). The context step (``context.scan``: walk, read, hash, and the scan) is timed on it, the sides
alternating within each repeat (their order rotated every repeat), after one warm-up read so the page
cache holds the folder for all of them:

- ``bare``: without the scan (``secrets=False``);
- ``cold``: with it and no cache of clean files (a first build, or files all changed), anchors found
  the best way installed (``secretanchors.matcher()``);
- ``cold_python``: the same with the pure-Python way, when ``ahocorasick_rs`` is installed;
- ``warm``: with the cache of files scanned clean filled by an earlier build of the same folder (a
  rebuild; its load and save are timed).

``*_pct`` = 100 x (median of the per-repeat ratios side / bare - 1); ``cpu`` the same for the process's
CPU time (what a busier machine would pay). ``stage_s``: ``context.stage`` (the copy the engine is
given, hard links; median of 3), the other part of a pushing build's context step before the engine's
own; ``cost_with_stage_pct``: each side's added median time against bare + stage.

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

from launcher.service.imagebuild import context, secretanchors, secretcache, secretscan

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


def use_matcher(pure: bool, fast: object) -> None:
    """Find anchors the pure-Python way (``pure``) or with ``fast`` (the ahocorasick_rs module)."""
    secretanchors._ac = None if pure else fast  # type: ignore[assignment]
    secretanchors.anchors.cache_clear()
    secretscan._rules.cache_clear()
    secretcache.version.cache_clear()


def timed(root: Path, side: str, warm_cache: Path, fast: object) -> tuple[float, float, context.Context]:
    use_matcher(side == "cold_python", fast)
    cache = secretcache.CleanCache(warm_cache if side == "warm" else None)
    t, c = time.perf_counter(), time.process_time()
    ctx = context.scan(root, secrets=side != "bare", cache=cache)
    return time.perf_counter() - t, time.process_time() - c, ctx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=400)
    ap.add_argument("--text-share", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep", help="generate into (and keep) this folder")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ctxbench-"))
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ctxbench-cache-", dir=root.parent))
    fast = secretanchors._ac
    try:
        counts = generate(root, args.size_mb << 20, args.text_share)
        warm_cache = scratch / "scanned-clean"
        timed(root, "bare", warm_cache, fast)  # warm the page cache
        use_matcher(False, fast)
        filled = secretcache.CleanCache(warm_cache)
        context.scan(root, cache=filled)  # the earlier build that fills the cache
        listed, stages = context.scan(root, secrets=False), []
        for _ in range(3):
            t = time.perf_counter()
            context.stage(listed, scratch / "staged")
            stages.append(time.perf_counter() - t)
            shutil.rmtree(scratch / "staged")
        stage_s = statistics.median(stages)
        sides = ["bare", "cold", "warm"] + (["cold_python"] if fast is not None else [])
        took: dict[str, list[float]] = {s: [] for s in sides}
        cpu: dict[str, list[float]] = {s: [] for s in sides}
        found: dict[str, int] = {}
        ctx = None
        for i in range(args.repeats):
            for side in sides[i % len(sides):] + sides[:i % len(sides)]:
                wall, used, c = timed(root, side, warm_cache, fast)
                took[side].append(round(wall, 3))
                cpu[side].append(round(used, 3))
                found[side] = len(c.findings)
                ctx = c if side == "cold" else ctx
        assert ctx is not None

        def pct(series: dict[str, list[float]], side: str) -> float:
            ratios = [a / b for a, b in zip(series[side], series["bare"], strict=True)]
            return round(100 * (statistics.median(ratios) - 1), 1)

        use_matcher(False, fast)
        print(json.dumps({
            "bench": "context_scan", "size_mb": args.size_mb, "text_share": args.text_share, "files": counts,
            "entries": len(ctx.entries), "unscanned": len(ctx.unscanned), "findings": found,
            "matcher": secretanchors.matcher(), "cached_clean": len(filled.known),
            "seconds": took, "median_s": {s: statistics.median(v) for s, v in took.items()},
            "cost_pct": {s: pct(took, s) for s in sides if s != "bare"},
            "cpu_s": cpu, "cpu_pct": {s: pct(cpu, s) for s in sides if s != "bare"},
            "stage_s": round(stage_s, 3),
            # Against the whole context step of a build that pushes: the hashing and the staging.
            "cost_with_stage_pct": {s: round(100 * (statistics.median(took[s]) - statistics.median(took["bare"]))
                                             / (statistics.median(took["bare"]) + stage_s), 1)
                                    for s in sides if s != "bare"},
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        }, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
