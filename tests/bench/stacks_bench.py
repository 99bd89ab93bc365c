#!/usr/bin/env python3
"""How long ``ddpjob stacks`` takes on a job of many nodes (issue 44: a 16-node local job within 5 s);
prints JSON.

A real local job of ``--nodes`` nodes x 1 process (gloo on CPU), each rank in a barrier every second
(a job that runs, not one that ended), submitted through the CLI with ``$DDPJOB_HOME`` in a temporary
folder. Once every rank's pid is in its node's sample (``ddpjob top -o json`` shows each rank), the
command ``ddpjob stacks ID -o json`` is run ``--repeats`` times, each timed whole by the wall clock
(the CLI's start included, as a user waits for it), and its answer checked: every rank read, none
refused. Figures: each run's seconds, the median and the worst; ``ranks`` read; py-spy's version.

Needs py-spy (``pip install 'ddpjob[stacks]'``). Usage: python tests/bench/stacks_bench.py [--nodes 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
while True:
    dist.barrier()
    time.sleep(1.0)
"""


def ddpjob(env: dict[str, str], *args: str, cwd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env, text=True,
                         capture_output=True, timeout=300)
    if check and out.returncode != 0:
        raise SystemExit(f"ddpjob {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stacks-bench-") as tmp:
        env = {**os.environ, "DDPJOB_HOME": os.path.join(tmp, "home")}
        Path(tmp, "barrier.py").write_text(PROGRAM)
        job = ddpjob(env, "submit", "-q", "--target", "local", "--nodes", str(args.nodes), "--name", "stacks-bench",
                     "--", "python", "barrier.py", cwd=tmp).stdout.strip()
        try:
            deadline, ranks = time.monotonic() + 240, 0
            while time.monotonic() < deadline:
                top = json.loads(ddpjob(env, "top", job, "-o", "json", cwd=tmp).stdout or "{}")
                ranks = sum(1 for n in (top.get("health") or {}).get("nodes", []) for r in n.get("ranks", []) if r.get("pid"))
                if ranks >= args.nodes:
                    break
                time.sleep(1)
            else:
                raise SystemExit(f"only {ranks} of {args.nodes} ranks sampled after 240 s")
            times, read = [], 0
            for _ in range(args.repeats):
                start = time.monotonic()
                out = ddpjob(env, "stacks", job, "-o", "json", cwd=tmp)
                times.append(time.monotonic() - start)
                got = json.loads(out.stdout)
                stacks = got.get("ranks", [])
                read = sum(1 for r in stacks if r.get("threads") and not r.get("error"))
                if read != args.nodes:
                    raise SystemExit(f"stacks read {read} of {args.nodes} ranks: {out.stdout[:2000]}")
        finally:
            ddpjob(env, "cancel", job, "-y", cwd=tmp, check=False)
    py_spy = subprocess.run(["py-spy", "--version"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"nodes": args.nodes, "ranks_read": read, "seconds": [round(t, 2) for t in times],
                      "median_s": round(statistics.median(times), 2), "worst_s": round(max(times), 2),
                      "cores": os.cpu_count(), "python": platform.python_version(), "py_spy": py_spy}, indent=1))


if __name__ == "__main__":
    main()
