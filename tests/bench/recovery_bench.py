#!/usr/bin/env python3
"""What a lost node costs a local job (issue 43); prints JSON.

The reference trainer (mlp on synthetic data, CPU, gloo) as a local job of ``--nodes`` nodes, run as a
user runs it (``ddpjob submit``, the spec's defaults: ``recovery.max_losses`` 10, the trainer's
``--checkpoint-seconds auto``), in two sides alternating within each pair (the order flipped every pair):

- ``killed``: every ``--kill-every`` seconds from its first training step, one whole node (its ddpjob
  node wrapper, torchrun agent and worker) is SIGKILLed, the nodes in turn from the first (whose agent
  holds the rendezvous store);
- ``unfailed``: the same job, nothing killed.

Per loss (from ``status -o json``, read from the supervisor's records and the run's metrics file):
``to_next_step_s`` (from the kill to the first training step after the way back), ``back_s`` (from the
kill to the nodes started again), ``lost_steps`` (trained again) and ``lost_s`` (from the checkpoint it
resumed from to that first step). Per run: wall time, steps, final eval loss, and ``goodput`` (the share
of its wall time that went into training it kept: ``launcher.targets.shared.recovery.told``).

The run's length is set by a probe run first (steps per second on this machine), so that one run takes
about ``--minutes``. Usage:

    python tests/bench/recovery_bench.py [--minutes 10] [--kill-every 120] [--pairs 1] [--nodes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from testkit import descendants  # noqa: E402 - the tests' own walk of a process tree

TRAIN = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "12288", "--eval-size", "1000",
         "--batch-size", "64", "--lr", "0.05", "--seed", "0", "--log-every", "10"]


def ddpjob(home: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "DDPJOB_HOME": home, "DDPJOB_CONFIG": "none"}, timeout=3600)


def status(home: str, job_id: str) -> dict:
    return json.loads(ddpjob(home, "status", job_id, "-o", "json").stdout)


def metrics(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "output" / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def submit(home: str, spec: Path, steps: int, epochs: int, nodes: int) -> str:
    words = ", ".join(f'"{w}"' for w in [*TRAIN, "--epochs", str(epochs), "--max-steps", str(steps)])
    spec.write_text(f"name: {spec.stem}\ncommand: [python, -m, launcher.train, {words}]\nnodes: {nodes}\n")
    proc = ddpjob(home, "submit", str(spec), "-q")
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return proc.stdout.strip()


def run(home: str, folder: Path, kind: str, steps: int, epochs: int, kill_every: float, nodes: int) -> dict:
    job_id = submit(home, folder / f"{kind}.yaml", steps, epochs, nodes)
    data = status(home, job_id)
    first = None
    kills: list[float] = []
    while True:
        st = status(home, job_id)
        if st["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        if first is None:
            first = next((m["time"] for m in metrics(data["run_dir"]) if m.get("event") == "step"), None)
        elif kind == "killed" and time.time() >= first + kill_every * (len(kills) + 1):
            rows = st["status"]["tasks"][0]["nodes"]
            victim = next((n["pid"] for n in rows if n["node"] == len(kills) % nodes), None)
            if victim is not None:
                kills.append(time.time())
                for pid in [victim, *descendants(victim)]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        time.sleep(0.5)
    from launcher.targets.shared import recovery

    run_dir = Path(data["run_dir"])
    ms = metrics(data["run_dir"])
    summary = json.loads((run_dir / "output" / "summary.json").read_text()) if st["state"] == "SUCCEEDED" else {}
    element = json.loads((run_dir / "state.json").read_text())["elements"][0]
    metrics_file = str(run_dir / "output" / "metrics.jsonl")
    losses, goodput = recovery.told(element.get("losses"), metrics_file, started=element["started"],
                                    ended=element["ended"], now=time.time())
    return {
        "kind": kind, "job": job_id, "state": st["state"], "wall_s": round(element["ended"] - element["started"], 1),
        "steps": max((m["step"] for m in ms if m.get("event") == "step"), default=0),
        "eval_loss": summary.get("eval_loss"), "goodput": None if goodput is None else round(goodput, 4),
        "kills": len(kills), "checkpoints": sum(1 for m in ms if m.get("event") == "checkpoint"),
        "losses": [{"node": loss.node, "back_s": round(loss.back_at - kill, 2) if loss.back_at else None,
                    "to_next_step_s": round(loss.first_step_at - kill, 2) if loss.first_step_at else None,
                    "lost_steps": loss.lost_steps, "lost_s": None if loss.lost_s is None else round(loss.lost_s, 2),
                    "resumed_step": loss.resumed_step}
                   for loss, kill in zip(losses, kills)],
        "_rate": _rate(ms),
    }


def _rate(ms: list[dict]) -> float:
    """Steps per second of training, from the metrics file's first to its last step line."""
    steps = [m for m in ms if m.get("event") == "step"]
    if len(steps) < 2 or steps[-1]["time"] <= steps[0]["time"]:
        return 1.0
    return (steps[-1]["step"] - steps[0]["step"]) / (steps[-1]["time"] - steps[0]["time"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--kill-every", type=float, default=120.0)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpjob-recovery-bench-") as tmp:
        home, folder = str(Path(tmp) / "home"), Path(tmp)
        probe = run(home, folder, "probe", 600, 1000, 0, args.nodes)
        rate = probe.pop("_rate")  # steps per second between its first and last step
        steps = max(100, int(rate * args.minutes * 60))
        print(json.dumps({"probe": probe, "steps": steps}), flush=True)
        runs = []
        for pair in range(args.pairs):
            for kind in (("unfailed", "killed") if pair % 2 == 0 else ("killed", "unfailed")):
                r = run(home, folder, kind, steps, 1000, args.kill_every, args.nodes)
                r.pop("_rate")
                runs.append(r)
                print(json.dumps(r), flush=True)
        killed = [r for r in runs if r["kind"] == "killed"]
        unfailed = [r for r in runs if r["kind"] == "unfailed"]
        print(json.dumps({
            "machine": f"{os.cpu_count()} cores", "nodes": args.nodes, "minutes": args.minutes, "kill_every_s": args.kill_every,
            "unfailed_goodput": [r["goodput"] for r in unfailed], "killed_goodput": [r["goodput"] for r in killed],
            "unfailed_wall_s": [r["wall_s"] for r in unfailed], "killed_wall_s": [r["wall_s"] for r in killed],
            "max_to_next_step_s": max((loss["to_next_step_s"] or 0 for r in killed for loss in r["losses"]), default=None),
            "eval_loss": {"unfailed": [r["eval_loss"] for r in unfailed], "killed": [r["eval_loss"] for r in killed]},
        }), flush=True)


if __name__ == "__main__":
    main()
