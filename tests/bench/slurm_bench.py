"""Slurm target benchmark: prints one JSON object.

    python tests/bench/slurm_bench.py [--folder DIR] [--array 10] [--repeat 3]

Measures, against a running Slurm (e.g. ``slurm/cluster.sh``; Slurm commands on PATH):
- render: ``ddpjob render --target slurm`` wall time (a fresh CLI process) and the in-process plan();
- a trivial 1-node job: from the start of a fresh process to RUNNING and to done, for ``ddpjob submit``
  and for a user's own submitit script (``python user_submit.py``, written by this benchmark) that
  submits the same torchrun work (one agent, ``--max-restarts 0 --tee 3 --log-dir`` as ddpjob gives it,
  on a free port) and waits for its result;
- a 10-element array the same way (ddpjob: a sweep; the script: ``map_array``).

Both sides are observed with the same query (``launcher.targets.slurm.query.query``, polled every
0.25 s) from the moment their process starts, so the numbers compare the submission paths, not the
pollers; the script's own end (after ``job.result()``) is reported as ``script_exit_s``. The array's
"to RUNNING" is when *every* element has started, so on a small machine it includes waiting for CPUs
freed by earlier elements.

With ``--repeat N`` the two sides run one after another N times, forwards in even repeats and
backwards in odd ones (so load affects them alike); figures are medians (``samples_to_done_s`` lists
every run), and ``ratios`` gives ``single_to_done`` and ``array_to_done`` = ddpjob / the user's script.
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
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from launcher.core.states import JobState  # noqa: E402
from launcher.targets.slurm.query import map_state, query  # noqa: E402


def _times(job_id: str, elements: list[str], t0: float, timeout: float = 600) -> dict[str, float]:
    """Seconds from t0 until every element was seen RUNNING (or done) and until all are done."""
    running_at = None
    while True:
        recs = query([job_id])
        states = [map_state(recs[e].state) if e in recs else JobState.PENDING for e in elements]
        now = time.perf_counter()
        if running_at is None and all(s != JobState.PENDING for s in states):
            running_at = now
        if all(s.terminal for s in states):
            if not all(s == JobState.SUCCEEDED for s in states):
                raise RuntimeError(f"job {job_id} ended {states}")
            return {"to_running_s": round((running_at or now) - t0, 3), "to_done_s": round(now - t0, 3)}
        if now - t0 > timeout:
            raise RuntimeError(f"job {job_id} did not finish in {timeout}s: {states}")
        time.sleep(0.25)


def _ddpjob(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"ddpjob {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def bench_render(env: dict[str, str]) -> dict[str, float]:
    t0 = time.perf_counter()
    _ddpjob(["render", "jobs/sweep.yaml", "--target", "slurm"], env)
    cli_s = time.perf_counter() - t0
    from launcher.spec.load import load_spec
    from launcher.targets.base import PlanContext
    from launcher.targets.slurm.target import SlurmTarget

    loaded = load_spec(REPO / "jobs/sweep.yaml")
    ctx = PlanContext(job_id="sweep-xxxxx", run_dir="/tmp/x", home=str(Path.home()), cwd=str(REPO), python=sys.executable)
    t0 = time.perf_counter()
    for _ in range(100):
        SlurmTarget().plan(loaded, ctx).render()
    return {"cli_render_s": round(cli_s, 3), "plan_and_render_ms": round((time.perf_counter() - t0) * 10, 3)}


def bench_ddpjob(folder: str, env: dict[str, str], array: int) -> dict[str, Any]:
    from launcher.service.registry import Registry

    registry = Registry(Path(env["DDPJOB_HOME"]))
    sets = ["--set", f"slurm.folder={folder}", "--set", f"workdir={REPO}", "--set", "slurm.time='10'",
            "--nodes", "1", "-p", "1"]
    t0 = time.perf_counter()
    job_id = _ddpjob(["submit", "--target", "slurm", "-q", "--name", "bench-one", *sets, "--", "true"], env).strip()
    sid = str(registry.get(job_id).handle["slurm_job_id"])  # type: ignore[index]
    single = _times(sid, [sid], t0)
    values = ",".join(str(i) for i in range(array))
    t0 = time.perf_counter()
    job_id = _ddpjob(["submit", "--target", "slurm", "-q", "--name", "bench-array", *sets,
                      "--set", f"sweep.i=[{values}]", "--set", "slurm.array_parallelism=" + str(array),
                      "--", "true", "{i}"], env).strip()
    sid = str(registry.get(job_id).handle["slurm_job_id"])  # type: ignore[index]
    arr = _times(sid, [f"{sid}_{i}" for i in range(array)], t0)
    return {"single": single, "array": arr}


# What a user would write to run the same torchrun work through submitit and wait for it.
USER_SCRIPT = """
import socket, subprocess, sys
import submitit

def node(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                    "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
                    "--tee", "3", "--log-dir", sys.argv[1] + "/torchrun", "--no-python", *args], check=True)

if __name__ == "__main__":
    folder, array = sys.argv[1], int(sys.argv[2])
    ex = submitit.SlurmExecutor(folder=folder + "/%j")
    ex.update_parameters(nodes=1, ntasks_per_node=1, time=10, array_parallelism=max(array, 1))
    if array:
        jobs = ex.map_array(node, [["true", str(i)] for i in range(array)])
    else:
        jobs = [ex.submit(node, ["true"])]
    print(str(jobs[0].job_id).split("_")[0], flush=True)
    for job in jobs:
        job.result()
"""


def bench_user_script(folder: str, array: int) -> dict[str, Any]:
    """A user's own submitit script, run as a fresh process: one job, then an array of ``array``."""
    script = Path(folder) / "user_submit.py"
    if not script.exists():
        script.write_text(USER_SCRIPT)
    out: dict[str, Any] = {}
    for kind, n in (("single", 0), ("array", array)):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(script), f"{folder}/user-script", str(n)],
                                stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert proc.stdout is not None
        try:
            sid = proc.stdout.readline().strip()
            out[kind] = _times(sid, [sid] if not n else [f"{sid}_{i}" for i in range(n)], t0)
            if proc.wait(timeout=300) != 0:
                raise RuntimeError(f"the user's submitit script failed ({kind})")
        finally:
            if proc.poll() is None:  # the job failed or timed out: the script would wait on
                proc.kill()
                proc.wait()
        out[kind]["script_exit_s"] = round(time.perf_counter() - t0, 3)
    return out


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    import statistics

    return {kind: {k: round(statistics.median(r[kind][k] for r in runs), 3) for k in runs[0][kind]}
            for kind in ("single", "array")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="shared folder for jobs (default: a new temporary directory)")
    ap.add_argument("--array", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs of each side (medians reported)")
    args = ap.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="ddpjob-slurm-bench-")
    home = tempfile.mkdtemp(prefix="ddpjob-bench-home-")
    env = {**os.environ, "DDPJOB_HOME": home}
    result: dict[str, Any] = {"render": bench_render(env), "array_size": args.array, "folder": folder,
                              "repeat": args.repeat}
    runs: dict[str, list[dict[str, Any]]] = {"ddpjob": [], "user_script": []}
    sides = {
        "ddpjob": lambda: bench_ddpjob(folder, env, args.array),
        "user_script": lambda: bench_user_script(folder, args.array),
    }
    for i in range(args.repeat):
        # forwards in even repeats, backwards in odd ones: each side runs as often first as last
        for side in (list(sides) if i % 2 == 0 else list(reversed(sides))):
            runs[side].append(sides[side]())
    for side, values in runs.items():
        result[side] = _median(values)
    result["samples_to_done_s"] = {side: {kind: [r[kind]["to_done_s"] for r in values] for kind in ("single", "array")}
                                   for side, values in runs.items()}
    result["ddpjob_minus_user_script_s"] = {
        kind: {k: round(result["ddpjob"][kind][k] - result["user_script"][kind][k], 3) for k in ("to_running_s", "to_done_s")}
        for kind in ("single", "array")
    }
    result["ratios"] = {
        f"{kind}_to_done": round(result["ddpjob"][kind]["to_done_s"] / result["user_script"][kind]["to_done_s"], 3)
        for kind in ("single", "array")
    }
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
