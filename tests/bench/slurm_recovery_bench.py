#!/usr/bin/env python3
"""What a lost node costs a Slurm job (issue 43); prints JSON.

The reference trainer (mlp on synthetic data, CPU, gloo) as a Slurm job of 2 nodes (or 3,
``--nodes 3``) on the private cluster with its nodes apart (``sudo slurm/cluster.sh up --apart``; run as root, which cuts links), as
a user runs it (``ddpjob submit``, the spec's defaults: ``recovery: {max_losses: 10, min_nodes: 1,
lost_after: 30}``, the trainer's ``--checkpoint-seconds auto``), in two sides alternating within each
pair (the order flipped every pair):

- ``lost``: ``--lose-at`` seconds after its first training step, a node (``--lose``: n2, the second,
  by default; n1 is the first node, the batch host) is lost for good: its link cut (``--how cut``) or
  its slurmd and every process on it killed (``--how kill``); the run goes on on the nodes left (a lost
  first node's place taken by the next, which needs 3 nodes: a majority);
- ``unfailed``: the same job, nothing lost.

Per loss (from ``status -o json``: the first node's ``recovery.json`` and the run's metrics file):
``noticed_s`` (from the loss to the first node's verdict: ``lost_after`` and a heartbeat or two),
``to_next_step_s`` (from the loss to the first training step on the nodes left), ``lost_s`` (from the
checkpoint it resumed from to that step). Per run: wall time, final eval loss and ``goodput``. The cut
link is restored (or the node's slurmd started again) after each run. Usage:

    python tests/bench/slurm_recovery_bench.py [--minutes 3] [--lose-at 60] [--pairs 1] [--how cut]
        [--nodes 2|3] [--lose n2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
from recovery_bench import ddpjob, status  # noqa: E402 - the local bench's ddpjob calls, one home per run

CLUSTER = str(REPO / "slurm" / "cluster.sh")
TRAIN = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "12288", "--eval-size", "1000",
         "--batch-size", "64", "--lr", "0.05", "--seed", "0", "--log-every", "10", "--step-delay", "0.05"]


def metrics(job_dir: str) -> list[dict]:
    path = Path(job_dir) / "output" / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def lose(how: str, node: str) -> None:
    if how == "cut":
        subprocess.run(["bash", CLUSTER, "link", node, "down"], check=True, capture_output=True)
        return
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    ns = next(n for n in names if n.startswith("ddpjob-") and n.endswith(f"-{node}"))
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout.split()
    subprocess.run(["kill", "-9", *pids], check=False)


def restore(how: str, node: str) -> None:
    args = ["link", node, "up"] if how == "cut" else ["up", "--apart"]
    subprocess.run(["bash", CLUSTER, *args], check=True, capture_output=True, timeout=600)


def run(home: str, folder: Path, kind: str, steps: int, lose_at: float, how: str, nodes: int, node: str) -> dict:
    words = ", ".join(f'"{w}"' for w in [*TRAIN, "--epochs", "1000", "--max-steps", str(steps)])
    spec = folder / f"{kind}.yaml"
    spec.write_text(f"name: {kind}\nworkdir: {REPO}\ncommand: [python, -m, launcher.train, {words}]\nnodes: {nodes}\n"
                    f"slurm: {{folder: {folder / 'slurm'}, time: '60', partition: {'three' if nodes > 2 else 'debug'}}}\n")
    proc = ddpjob(home, "submit", str(spec), "--target", "slurm", "-q")
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    job_id = proc.stdout.strip().splitlines()[-1]
    job_dir = status(home, job_id)["handle"]["job_dir"]
    first = lost = None
    while True:
        st = status(home, job_id)
        if st["status"]["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        if first is None:
            first = next((m["time"] for m in metrics(job_dir) if m.get("event") == "step"), None)
        elif kind == "lost" and lost is None and time.time() >= first + lose_at:
            lost = time.time()
            lose(how, node)
        time.sleep(1)
    if lost is not None:
        restore(how, node)
    summary_path = Path(job_dir) / "output" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    task = st["status"]["tasks"][0]
    # Goodput for both sides alike: from the first node's runner's start to the run's end (its record; the
    # run's record where the first node was lost), the losses in recovery.json (none for the unfailed
    # run) and the metrics file.
    from launcher.targets.shared import recovery

    node0 = json.loads((Path(job_dir) / "task-0" / "node-0.json").read_text())
    rec_path = Path(job_dir) / "task-0" / "recovery.json"
    rec = json.loads(rec_path.read_text()) if rec_path.exists() else {}
    rows = rec.get("losses") or []
    if rec.get("first"):
        node0 = {**node0, "ended": rec.get("ended")}
    _, goodput = recovery.told(rows, str(Path(job_dir) / "output" / "metrics.jsonl"), started=node0["started"],
                               ended=node0.get("ended"), now=time.time())
    return {
        "kind": kind, "job": job_id, "state": st["status"]["state"], "eval_loss": summary.get("eval_loss"),
        "wall_s": round(node0["ended"] - node0["started"], 1) if node0.get("ended") else None,
        "goodput": None if goodput is None else round(goodput, 4), "world_size_at_end": summary.get("world_size"),
        "losses": [{"node": loss["node"], "noticed_s": round(loss["at"] - lost, 1) if lost else None,
                    "to_next_step_s": round(loss["first_step_at"] - lost, 1) if lost and loss.get("first_step_at") else None,
                    "lost_s": loss.get("lost_s"), "resumed_step": loss.get("resumed_step")}
                   for loss in task.get("losses") or []],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="the unfailed run's length, about")
    ap.add_argument("--lose-at", type=float, default=60.0, help="seconds after the first step")
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--how", choices=("cut", "kill"), default="cut")
    ap.add_argument("--nodes", type=int, choices=(2, 3), default=2)
    ap.add_argument("--lose", choices=("n1", "n2", "n3"), default="n2", help="the node lost (n1: the first)")
    args = ap.parse_args()
    if args.lose in ("n1", "n3") and args.nodes < 3:
        raise SystemExit(f"--lose {args.lose} needs --nodes 3 (n1: the nodes left must be a majority; n3: 3 nodes)")
    if "SLURM_CONF" not in os.environ:
        raise SystemExit('run eval "$(slurm/cluster.sh env)" first (after sudo slurm/cluster.sh up --apart)')
    with tempfile.TemporaryDirectory(prefix="ddpjob-slurm-recovery-bench-") as tmp:
        home, folder = str(Path(tmp) / "home"), Path(tmp)
        # 2 ranks of batch 64 at about 0.06 s a step on this kind of machine: steps for --minutes.
        steps = int(args.minutes * 60 / 0.06)
        runs = []
        for pair in range(args.pairs):
            for kind in (("unfailed", "lost") if pair % 2 == 0 else ("lost", "unfailed")):
                r = run(home, folder, kind, steps, args.lose_at, args.how, args.nodes, args.lose)
                runs.append(r)
                print(json.dumps(r), flush=True)
        print(json.dumps({
            "machine": f"{os.cpu_count()} cores", "nodes": args.nodes, "lost": args.lose, "how": args.how, "steps": steps, "lose_at_s": args.lose_at,
            "goodput": {k: [r["goodput"] for r in runs if r["kind"] == k] for k in ("unfailed", "lost")},
            "wall_s": {k: [r["wall_s"] for r in runs if r["kind"] == k] for k in ("unfailed", "lost")},
            "to_next_step_s": [loss["to_next_step_s"] for r in runs for loss in r["losses"]],
            "eval_loss": {k: [r["eval_loss"] for r in runs if r["kind"] == k] for k in ("unfailed", "lost")},
        }), flush=True)


if __name__ == "__main__":
    main()
