#!/usr/bin/env python3
"""Time and memory of the largest plans: prints JSON, one entry per case and target.

- ``refused``: a 1,000-run sweep at 1,024 nodes (5 KB of YAML), refused by the process bound.
- ``largest``: 16 nodes x 1,024 runs (the bound, 16,384 processes) rendered in full plan, summarised text.
Each figure is the median over the repeats of wall seconds and the peak RSS (KB) of a fresh ``ddpjob render``.

Usage: python tests/bench/plan_size_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def spec(folder: Path, name: str, runs: int, nodes: int) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": "big", "image": "img:1", "command": ["python", "t.py", "{i}"],
                                    "nodes": nodes, "procs_per_node": 1, "sweep": {"i": list(range(runs))}}))
    return str(path)


def measure(args: list[str]) -> tuple[float, int, int, int]:
    """Wall seconds, peak RSS in KB, exit code and output bytes of one fresh ``ddpjob`` process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss, proc.returncode, len(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    results: dict[str, dict[str, float | int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = {"refused": spec(folder, "refused", 1000, 1024), "largest": spec(folder, "largest", 1024, 16)}
        for case, path in cases.items():
            for target in ("local", "slurm", "k8s"):
                runs = [measure(["render", path, "-t", target]) for _ in range(repeats)]
                results[f"{case}_{target}"] = {"wall_s": round(statistics.median(r[0] for r in runs), 3),
                                               "peak_rss_kb": max(r[1] for r in runs),
                                               "exit": runs[0][2], "output_bytes": runs[0][3]}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
