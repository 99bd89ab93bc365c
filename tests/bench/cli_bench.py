#!/usr/bin/env python3
"""Benchmark the front door and the local target's overhead; prints JSON.

- ``help_s``: wall time of ``ddpjob --help`` (median of N runs, fresh interpreter each time).
- ``import_cli_s``: ``python -c 'import launcher.cli'`` for comparison with bare ``python -c pass``.
- ``submit_follow_s`` versus ``torchrun_by_hand_s``: a trivial 2-node job (each process does one gloo
  all_reduce) through ``ddpjob submit -f``, and the same two torchrun agents started by hand;
  ``overhead_ratio`` = ddpjob / by hand. Runs alternate so machine load affects both alike.

Usage: python tests/bench/cli_bench.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""


def timed(cmd: list[str], **kw) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_hand(workdir: Path) -> float:
    port = str(free_port())
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--master-addr", "127.0.0.1", "--master-port", port]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    agents = [subprocess.Popen([*base, "--node-rank", str(i), "trivial.py"], cwd=workdir, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    codes = [a.wait() for a in agents]
    assert codes == [0, 0], codes
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ddpjob = [sys.executable, "-m", "launcher"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "trivial.py").write_text(SCRIPT)
        env = {**os.environ, "DDPJOB_HOME": str(work / "home")}
        help_s = [timed([*ddpjob, "--help"]) for _ in range(args.repeats)]
        import_s = [timed([sys.executable, "-c", "import launcher.cli"]) for _ in range(args.repeats)]
        bare_s = [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
        ours, hand = [], []
        for _ in range(args.repeats):
            hand.append(by_hand(work))
            ours.append(timed([*ddpjob, "submit", "-q", "-f", "--nodes", "2", "--", "python", "trivial.py"], cwd=work, env=env))
    result = {
        "benchmark": "cli",
        "repeats": args.repeats,
        "help_s": round(statistics.median(help_s), 4),
        "import_cli_s": round(statistics.median(import_s), 4),
        "python_startup_s": round(statistics.median(bare_s), 4),
        "submit_follow_s": round(statistics.median(ours), 3),
        "torchrun_by_hand_s": round(statistics.median(hand), 3),
        "overhead_ratio": round(statistics.median(ours) / statistics.median(hand), 3),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
