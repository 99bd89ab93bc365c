#!/usr/bin/env python3
"""Benchmark the front door and the local target's overhead; prints JSON.

- ``help_s``: wall time of ``ddpjob --help`` (median of N runs, fresh interpreter each time), against
  ``python -c 'import click'`` (``help_over_click``).
- ``render_s`` / ``render_over_help``: ``ddpjob render jobs/cifar.yaml --target T`` for local, slurm
  and k8s (k8s with the strict CRD check when ``DDPJOB_PYTORCHJOB_CRD`` or ``DDPJOB_SHARED`` gives the
  CRD: ``k8s_strict`` says whether it ran), each over ``--help``.
- ``render_floor_s`` / ``render_floor_over_help``: what any render must load before ddpjob's own work
  starts, without any of it: the CLI (``launcher.cli.main``, click), pydantic as the CLI uses it (without
  plugins, with its collector settings; ``launcher.cli.entry``) and PyYAML, in one fresh interpreter.
  ``render_s`` minus this is what ddpjob's spec models, reading the spec and the target's plan cost;
  ``render_over_floor`` per target is the goal's figure (<= 1.15).
- ``submit_follow_s`` versus ``torchrun_by_hand_s``: a trivial 2-node job (each process does one gloo
  all_reduce) through ``ddpjob submit -f``, and the same two torchrun agents started by hand;
  ``overhead_ratio`` = ddpjob / by hand. ``torchrun_with_ddpjob_flags_s``: the same pair with the
  options ddpjob's plan gives torchrun (``--tee 3 --log-dir``: per-rank files, rank-prefixed lines);
  ``launcher_ratio`` = ddpjob / that pair, the cost of ddpjob's own processes alone.
- ``tricks``: each start-up trick on and off side by side (``startup_tricks.py``): per path (``help``,
  ``render_<target>``, ``supervisor``) the time with every trick on, and per trick the paired gain in ms
  (median and quartiles over the repeats) and whether it is above noise (lower quartile above zero).
Every repeat runs each measurement once, forwards in even repeats and backwards in odd ones, so
machine load affects all sides alike; the figures are medians over the repeats. The package is
compiled first (as a pip install does) and each command runs once unmeasured.

Usage: python tests/bench/cli_bench.py [--repeats 11] [--skip-submit] [--skip-tricks]
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import startup_tricks  # noqa: E402

SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""

# The imports every render needs before ddpjob's own code runs, loaded the way the CLI loads them.
FLOOR = ("import gc, launcher.cli.entry as entry; entry.fewer_collections(); entry.without_pydantic_plugins(); "
         "import launcher.cli.main, pydantic.main, pydantic.fields, yaml; gc.freeze()")


def timed(cmd: list[str], **kw) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_hand(workdir: Path, ddpjob_flags: bool = False) -> float:
    """Two torchrun agents started by hand; with ``ddpjob_flags``, with the options and variables
    ddpjob's local plan adds (per-rank log files and rank-prefixed lines: ``--tee 3 --log-dir``)."""
    port = str(free_port())
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--master-addr", "127.0.0.1", "--master-port", port]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if ddpjob_flags:
        env["PYTHONUNBUFFERED"] = "1"
    start = time.perf_counter()
    agents = []
    with contextlib.ExitStack() as logs:
        for i in range(2):
            flags = ["--max-restarts", "0", "--tee", "3", "--log-dir", str(workdir / f"logs-{port}-{i}")]
            log = logs.enter_context(open(workdir / f"hand-{i}.log", "wb")) if ddpjob_flags else subprocess.DEVNULL
            agents.append(subprocess.Popen([*base, "--node-rank", str(i), *(flags if ddpjob_flags else []), "trivial.py"],
                                           cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [a.wait() for a in agents]
    assert codes == [0, 0], codes
    return time.perf_counter() - start


def _crd_env() -> dict[str, str]:
    crd = os.environ.get("DDPJOB_PYTORCHJOB_CRD")
    if not crd and os.environ.get("DDPJOB_SHARED"):
        crd = str(Path(os.environ["DDPJOB_SHARED"]) / "reference" / "kubeflow" / "kubeflow.org_pytorchjobs.yaml")
    return {"DDPJOB_PYTORCHJOB_CRD": crd} if crd and Path(crd).exists() else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--skip-submit", action="store_true", help="only the CLI start-up and render figures")
    ap.add_argument("--skip-tricks", action="store_true", help="without each start-up trick on and off")
    args = ap.parse_args()
    ddpjob = [sys.executable, "-m", "launcher"]
    crd = _crd_env()
    # A pip install compiles the package; a checkout run with PYTHONDONTWRITEBYTECODE would compile
    # every module on every call and measure the compiler instead.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "launcher")], check=True)
    samples: dict[str, list[float]] = {k: [] for k in ("help", "click", "floor", "local", "slurm", "k8s",
                                                       "ours", "hand", "flags")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "trivial.py").write_text(SCRIPT)
        env = {**os.environ, "DDPJOB_HOME": str(work / "home"), **crd}
        startup = {
            "help": lambda: timed([*ddpjob, "--help"], env=env),
            "click": lambda: timed([sys.executable, "-c", "import click"]),
            "floor": lambda: timed([sys.executable, "-c", FLOOR], cwd=REPO, env=env),
            **{t: (lambda t=t: timed([*ddpjob, "render", "jobs/cifar.yaml", "--target", t], cwd=REPO, env=env))
               for t in ("local", "slurm", "k8s")},
        }
        runs = {
            "hand": lambda: by_hand(work),
            "flags": lambda: by_hand(work, ddpjob_flags=True),
            "ours": lambda: timed([*ddpjob, "submit", "-q", "-f", "--nodes", "2", "--", "python", "trivial.py"],
                                  cwd=work, env=env),
        }
        # Phases, so that a job's last processes never slow a start-up figure down.
        for steps in (startup, {} if args.skip_submit else runs):
            for step in steps.values():  # warm-up (the CRD parse cache, the page cache): not measured
                step()
            for i in range(args.repeats):
                # forwards, then backwards: each side runs as often early as late in a repeat
                for name in (list(steps) if i % 2 == 0 else list(reversed(steps))):
                    samples[name].append(steps[name]())
            if steps is startup and not args.skip_tricks:
                tricks = startup_tricks.measure(work, env, args.repeats)
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    result: dict[str, object] = {
        "benchmark": "cli",
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "help_s": round(med["help"], 4),
        "click_import_s": round(med["click"], 4),
        "help_over_click": round(med["help"] / med["click"], 3),
        "render_s": {t: round(med[t], 4) for t in ("local", "slurm", "k8s")},
        "render_over_help": {t: round(med[t] / med["help"], 3) for t in ("local", "slurm", "k8s")},
        "k8s_strict": bool(crd),
        "render_floor_s": round(med["floor"], 4),
        "render_floor_over_help": round(med["floor"] / med["help"], 3),
        "render_over_floor": {t: round(med[t] / med["floor"], 3) for t in ("local", "slurm", "k8s")},
    }
    if not args.skip_submit:
        result.update({
            "submit_follow_s": round(med["ours"], 3),
            "torchrun_by_hand_s": round(med["hand"], 3),
            "overhead_ratio": round(med["ours"] / med["hand"], 3),
            "torchrun_with_ddpjob_flags_s": round(med["flags"], 3),
            "launcher_ratio": round(med["ours"] / med["flags"], 3),
        })
    # The spread says how far to trust a ratio: on a small shared machine one pair of torchrun agents
    # varies by +-10% from run to run, and a 5% bar sits inside that.
    if not args.skip_tricks:
        result["tricks"] = tricks
    result["iqr_s"] = {k: round(_iqr(v), 3) for k, v in samples.items() if len(v) >= 4}
    result["samples_s"] = {k: [round(x, 3) for x in v] for k, v in samples.items() if v}
    print(json.dumps(result, indent=1))


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


if __name__ == "__main__":
    main()
