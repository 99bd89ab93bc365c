#!/usr/bin/env python3
"""What the stall watch and the ranks' vitals cost the training (issue 34: under 1%); prints JSON.

The reference trainer (mlp on synthetic data, CPU, gloo) as a local job of 2 nodes x 1 process,
each node run through ddpjob's own node wrapper (``launcher/targets/local/job/node.py``, as the local
supervisor starts it), in two sides alternating within each repeat (the order flipped every repeat):

- ``watch``: as ddpjob runs it: ``DDPJOB_WATCH`` set, so the first node runs the ``Watch`` and the
  second a ``Beacon``, each sampling its rank from /proc and its log every 2 s, and the trainer
  writing its step report (``DDPJOB_VITALS_DIR``) every 2 s;
- ``bare``: the same wrappers and torchrun, no watch, no vitals, no step report;
- with ``--pair stacks,watch`` (issue 44: under 1%): ``stacks``, the watch as ddpjob runs it with py-spy
  installed (each node reads its rank's stack every 2 s without pausing it, ``stacks.FrameSampler``),
  against ``watch``, the same with that sampling off (``DDPJOB_SAMPLE_STACKS=0``).

Figures: the watch's CPU (the node wrappers' own CPU seconds with the watch less without it) as a
share of the run's CPU seconds (`watch_cpu_pct`, steady across repeats); and global images/s between the end of step ``--warmup`` and the last step, from the trainer's
metrics.jsonl. ``cost_pct`` = 100 x (1 - median of the per-repeat ratios watch / bare): under 1 is
the issue's bar. Run it on a quiet machine: other work there moves either side by more than 1%.

Usage: python tests/bench/watch_cost.py [--repeats 5] [--steps 400] [--warmup 40] [--batch 64] [--pair watch,bare]
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

from launcher.targets.shared.vitals import proc_stat

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "launcher" / "targets" / "local" / "job" / "node.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_all(pids: list[int]) -> tuple[list[int], float, float]:
    """Wait for the node wrappers: their exit codes, their own CPU seconds (polled: the last half second
    uncounted) and the CPU seconds of their whole trees (rusage of each wrapper and what it reaped)."""
    own: dict[int, float] = {}
    codes: dict[int, int] = {}
    tree = 0.0
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
                tree += usage.ru_utime + usage.ru_stime
            elif (stat := proc_stat(pid)) is not None:  # the wrapper's own CPU, where the watch's threads run
                own[pid] = stat[1]
        time.sleep(0.5)
    return [codes[p] for p in pids], sum(own.values()), tree


def run_side(side: str, steps: int, warmup: int, batch: int) -> tuple[float, float, float]:
    """One 2-node run: global images/s over the steps after ``warmup``, the node wrappers' own CPU
    seconds and the CPU seconds of everything the run started."""
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
            env.pop("DDPJOB_SAMPLE_STACKS", None)
            if side != "bare":
                env["DDPJOB_WATCH"] = f"node={node} nodes=2 timeout=300 action=report"
                env["DDPJOB_VITALS_DIR"] = str(Path(tmp) / "vitals")
            if side == "watch":
                env["DDPJOB_SAMPLE_STACKS"] = "0"
            log = open(Path(tmp) / f"node-{node}.log", "ab")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-I", "-S", str(NODE), str(Path(tmp) / f"node-{node}.exit.json"),
                                            "--", *argv], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        codes, own, tree = wait_all([p.pid for p, _ in procs])
        for p, _ in procs:
            p.returncode = 0  # reaped by wait_all
        for _, log in procs:
            log.close()
        if any(codes):
            raise SystemExit(f"a node failed ({codes}): {(Path(tmp) / 'node-0.log').read_text()[-2000:]}")
        if side != "bare" and not (Path(tmp) / "watch.json").exists():
            raise SystemExit("the watch side wrote no watch.json: the watch did not run")
        if side == "stacks" and '"frames"' not in (Path(tmp) / "watch.json").read_text():
            raise SystemExit("the stacks side sampled no frames: is py-spy installed beside this Python?")
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    t = {r["step"]: r["time"] for r in records if r.get("event") == "step"}
    return batch * 2 * (steps - warmup) / (t[steps] - t[warmup]), own, tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--pair", default="watch,bare", choices=["watch,bare", "stacks,watch"],
                    help="the side measured, then the side it is measured against")
    args = ap.parse_args()
    on, off = args.pair.split(",")
    runs: dict[str, list[float]] = {on: [], off: []}
    cpu: dict[str, list[list[float]]] = {on: [], off: []}  # [wrappers' own, whole run] CPU seconds
    for i in range(args.repeats):
        order = (on, off) if i % 2 == 0 else (off, on)
        for side in order:
            rate, own, tree = run_side(side, args.steps, args.warmup, args.batch)
            runs[side].append(rate)
            cpu[side].append([round(own, 3), round(tree, 3)])
    ratios = [w / b for w, b in zip(runs[on], runs[off])]
    # The CPU the measured side adds (the wrappers' own CPU with it less without it; for stacks the whole
    # run's, py-spy being the wrappers' children) as a share of a run's CPU: a direct figure, not moved by
    # the run-to-run swing of images/s on a shared machine.
    which = 1 if on == "stacks" else 0
    extra = statistics.median(c[which] for c in cpu[on]) - statistics.median(c[which] for c in cpu[off])
    whole = statistics.median(t for _, t in cpu[on])
    print(json.dumps({
        "pair": args.pair, f"{on}_cpu_s": round(extra, 3), "run_cpu_s": round(whole, 3),
        f"{on}_cpu_pct": round(100 * extra / whole, 3) if whole else None, "cpu_s": cpu,
        "images_per_s": runs, f"median_{on}": statistics.median(runs[on]),
        f"median_{off}": statistics.median(runs[off]), "ratios": ratios,
        "cost_pct": round(100 * (1 - statistics.median(ratios)), 2), "repeats": args.repeats, "steps": args.steps,
        "warmup": args.warmup, "batch": args.batch, "cpus": os.cpu_count(),
    }, indent=2))


if __name__ == "__main__":
    main()
