"""``ddpjob results`` on Kubernetes (issue 26): the runs write their metrics inside their pods, so the rows
have states and sweep values, no metrics, and a note says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ddpjob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)


def test_results_of_a_kubernetes_sweep_show_states_and_say_where_the_metrics_are(k8s_api):
    proc = ddpjob("submit", "jobs/sweep.yaml", "--target", "k8s", "--nodes", "1", "-q",
                  "--set", "command=[python, -c, 'print(\"lr={lr} seed={seed}\")']",
                  "--set", "sweep={lr: [0.1, 0.01], seed: [7]}")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[0]
    assert ddpjob("wait", job_id, "--timeout", "240").returncode == 0
    proc = ddpjob("results", job_id, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    assert [(r["values"], r["state"], r["final"], r["output_dir"]) for r in runs] == [
        ({"lr": 0.1, "seed": 7}, "SUCCEEDED", {}, None), ({"lr": 0.01, "seed": 7}, "SUCCEEDED", {}, None)]
    assert "no metrics: Kubernetes runs write their metrics inside their pods" in proc.stderr
    plot = ddpjob("plot", job_id, "-o", "x.png")
    assert plot.returncode == 2 and "nothing to plot: no metrics: Kubernetes runs" in plot.stderr
    assert not (REPO / "x.png").exists()
