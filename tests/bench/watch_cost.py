#!/usr/bin/env python3
"""What the stall watch and the ranks' vitals cost the training (issue 34: under 1%); prints JSON.

The reference trainer (mlp on synthetic data, CPU, gloo) as a local job of 2 nodes x 1 process,
each node run through ddpjob's own node wrapper (``launcher/targets/local/node.py``, as the local
supervisor starts it), in two sides alternating within each repeat (the order flipped every repeat):

- ``watch``: as ddpjob runs it: ``DDPJOB_WATCH`` set, so the first node runs the ``Watch`` and the
  second a ``Beacon``, each sampling its rank from /proc and its log every 2 s, and the trainer
  writing its step report (``DDPJOB_VITALS_DIR``) every 2 s;
- ``bare``: the same wrappers and torchrun, no watch, no vitals, no step report.

Figure: global images/s between the end of step ``--warmup`` and the last step, from the trainer's
metrics.jsonl. ``cost_pct`` = 100 x (1 - median of the per-repeat ratios watch / bare): under 1 is
the issue's bar. Run it on a quiet machine: other work there moves either side by more than 1%.

Usage: python tests/bench/watch_cost.py [--repeats 5] [--steps 400] [--warmup 40] [--batch 64]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "launcher" / "targets" / "local" / "node.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_side(watch: bool, steps: int, warmup: int, batch: int) -> float:
    """One 2-node run; global images/s over the steps after ``warmup``."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "output"
        train = ["-m", "launcher.train", "--dataset", "synthetic", "--model", "mlp", "--batch-size", str(batch),
                 "--train-size", str(batch * 2 * steps), "--eval-size", "64", "--epochs", "1", "--max-steps",
                 str(steps), "--log-every", str(warmup), "--output-dir", str(out)]
        procs = []
        for node in (0, 1):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                    "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                    "--tee", "3", *train]
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2)), "PYTHONPATH": str(REPO)}
            if watch:
                env["DDPJOB_WATCH"] = f"node={node} nodes=2 timeout=300 action=report"
                env["DDPJOB_VITALS_DIR"] = str(Path(tmp) / "vitals")
            log = open(Path(tmp) / f"node-{node}.log", "ab")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-I", "-S", str(NODE), str(Path(tmp) / f"node-{node}.exit.json"),
                                            "--", *argv], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        codes = [p.wait() for p, _ in procs]
        for _, log in procs:
            log.close()
        if any(codes):
            raise SystemExit(f"a node failed ({codes}): {(Path(tmp) / 'node-0.log').read_text()[-2000:]}")
        if watch and not (Path(tmp) / "watch.json").exists():
            raise SystemExit("the watch side wrote no watch.json: the watch did not run")
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    t = {r["step"]: r["time"] for r in records if r.get("event") == "step"}
    return batch * 2 * (steps - warmup) / (t[steps] - t[warmup])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"watch": [], "bare": []}
    for i in range(args.repeats):
        order = ("watch", "bare") if i % 2 == 0 else ("bare", "watch")
        for side in order:
            runs[side].append(run_side(side == "watch", args.steps, args.warmup, args.batch))
    ratios = [w / b for w, b in zip(runs["watch"], runs["bare"])]
    print(json.dumps({
        "images_per_s": runs, "median_watch": statistics.median(runs["watch"]),
        "median_bare": statistics.median(runs["bare"]), "ratios": ratios,
        "cost_pct": round(100 * (1 - statistics.median(ratios)), 2), "repeats": args.repeats, "steps": args.steps,
        "warmup": args.warmup, "batch": args.batch, "cpus": os.cpu_count(),
    }, indent=2))


if __name__ == "__main__":
    main()
