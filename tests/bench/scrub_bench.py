#!/usr/bin/env python3
"""How fast ``ddpjob logs`` masks what a job prints (``launcher.core.tokens.scrub``, once per line);
prints JSON.

A generated log (``--lines``) as a training job writes it: step lines with numbers and ``key=value``
pairs, paths and URLs, tracebacks' file lines, and here and there one of the job's secret values. The
job has three secret values (14, 9 and 42 characters, none with whitespace). Each side masks every
line, the sides alternating within each repeat (their order rotated every repeat):

- ``shapes``: a job without secret values (only the credential shapes are looked for);
- ``plain``: its values, as a record of this version keeps them (``Marks.plain``: only stretches
  without whitespace as long as the shortest value are searched);
- ``every_word``: the same values as a record of an older version keeps them (not saying whether they
  hold whitespace): every word of every line is searched;
- ``before``: with ``--against FILE``, the ``tokens.py`` in FILE (an older version, e.g. from
  ``git show REV:launcher/core/tokens.py``) masking the same lines with its own marks of the same values.

``mb_per_s``: the median over the repeats of the log's size over the side's time. Every side's output
is checked to be the same.

Usage: python tests/bench/scrub_bench.py [--lines 40000] [--repeats 5] [--against FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.core import tokens

VALUES = ["hunter2hunter2", "pa$$w0rd!", "sk-" + "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"[:39]]


def generate(lines: int, seed: int = 47) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        who = f"[node{i % 2} rank{i % 4}]"
        kind = rng.random()
        if kind < 0.7:
            out.append(f"{who} epoch {i // 1000} step {i} loss {rng.random():.4f} lr 0.1 grad_norm {rng.random() * 3:.3f} "
                       f"throughput {rng.random() * 1000:.1f} img/s data_ms={rng.random():.2f} compute_ms={rng.random() * 9:.2f}\n")
        elif kind < 0.85:
            out.append(f'{who}   File "/home/someone/project/src/train/loop_{i % 7}.py", line {i % 400}, in step\n')
        elif kind < 0.95:
            out.append(f"{who} saved checkpoint /scratch/runs/exp-{i % 13}/ckpt/step-{i:08d}.pt to "
                       f"s3://bucket-name/prefix/exp-{i % 13}/ (https://example.org/runs/{i})\n")
        else:
            out.append(f"{who} connecting to the database as trainer with {rng.choice(VALUES)} (attempt {i % 3})\n")
    return out


def load_before(path: str) -> object:
    spec = importlib.util.spec_from_file_location("tokens_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tokens_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=40000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--against", help="an older tokens.py to compare with (side 'before')")
    args = ap.parse_args()
    lines = generate(args.lines)
    size_mb = sum(len(line.encode()) for line in lines) / 1e6
    marks = tokens.Marks.of(VALUES)
    assert marks is not None and marks.plain
    older = dataclasses.replace(marks, plain=False)
    sides: dict[str, Callable[[str], str]] = {
        "shapes": lambda line: tokens.scrub(line, None),
        "plain": lambda line: tokens.scrub(line, marks),
        "every_word": lambda line: tokens.scrub(line, older),
    }
    if args.against:
        before = load_before(args.against)
        old_marks = before.Marks.of(VALUES)  # type: ignore[attr-defined]
        sides["before"] = lambda line: before.scrub(line, old_marks)  # type: ignore[attr-defined]
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[str]] = {}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = sides[name]
            t = time.perf_counter()
            out = [fn(line) for line in lines]
            times[name].append(time.perf_counter() - t)
            outputs[name] = out
    masked = outputs["plain"]
    assert sum(tokens.MASK in line for line in masked) >= args.lines // 40, "the values were not masked"
    assert all(outputs[n] == masked for n in names if n != "shapes"), "the sides masked differently"
    result = {
        "benchmark": "scrub", "lines": args.lines, "size_mb": round(size_mb, 2), "repeats": args.repeats,
        "mb_per_s": {n: round(size_mb / statistics.median(times[n]), 2) for n in names},
        "masked_lines": sum(tokens.MASK in line for line in masked),
        "environment": {"python": platform.python_version(), "machine": platform.machine()},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
