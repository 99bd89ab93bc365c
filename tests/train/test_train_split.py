"""Why a job is slow, said in one line (issue 32 item 4): real local jobs of the reference trainer with the
data loader slowed on purpose, then the all-reduce, and what the metrics file, ``status``, ``results``
and the progress line say of them; and ``--compile``, whose warm-up is logged apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

TRAIN = ["python", "-m", "launcher.train", "--dataset", "synthetic", "--model", "mlp", "--train-size", "1280",
         "--eval-size", "64", "--epochs", "1", "--batch-size", "32", "--log-every", "5"]


def _run(cli, nodes: int, *extra: str) -> tuple[str, list[dict]]:
    proc = cli("submit", "--target", "local", "--nodes", str(nodes), "-q", "-f", "--", *TRAIN, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    runs = json.loads(cli("results", job_id, "-o", "json", check=True).stdout)["runs"]
    lines = [json.loads(x) for x in Path(runs[0]["output_dir"], "metrics.jsonl").read_text().splitlines()]
    return job_id, [r for r in lines if r.get("event") == "step"]


def test_a_slow_data_loader_is_named(cli):
    # 100 ms before each batch is ready: well over the MLP's compute even on a loaded machine (at 50 ms a
    # CI run beside other work measured a data share of 0.43: compute had slowed to ~65 ms a step).
    job_id, steps = _run(cli, 1, "--bench-data-delay", "0.1")
    assert all({"data_ms", "compute_ms", "comm_ms"} <= set(r) for r in steps)
    assert all(r["data_ms"] >= 90 for r in steps[1:]) and all(r["comm_ms"] == 0 for r in steps)  # one process
    split = json.loads(cli("results", job_id, "-o", "json", check=True).stdout)["runs"][0]["step_split"]
    assert split["bound"] == "data" and split["shares"]["data"] > 0.5
    text = cli("results", job_id, check=True).stdout
    assert "data/compute/comm" in text.splitlines()[0]
    assert "run: data-bound:" in text and "--num-workers" in text
    status = cli("status", job_id, check=True).stdout
    assert "step: data " in status and "(data-bound)" in status  # the progress line
    assert "advice:   data-bound:" in status


def test_a_slow_all_reduce_is_named(cli):
    # 2 nodes of 1 process: DDP with gloo; each gradient all-reduce is held 200 ms before DDP sees it done.
    job_id, steps = _run(cli, 2, "--bench-comm-delay", "0.2")
    assert all(r["comm_ms"] >= 150 for r in steps[1:]), steps
    split = json.loads(cli("results", job_id, "-o", "json", check=True).stdout)["runs"][0]["step_split"]
    assert split["bound"] == "comm" and split["shares"]["comm"] > 0.5
    status = cli("status", job_id, check=True).stdout
    assert "(communication-bound)" in status and "advice:   communication-bound:" in status
    assert "--grad-compression" in status


def test_a_run_that_computes_gets_no_advice(cli):
    job_id, _ = _run(cli, 1)
    split = json.loads(cli("results", job_id, "-o", "json", check=True).stdout)["runs"][0]["step_split"]
    assert split["bound"] is None and split["advice"] is None and split["shares"]["compute"] > 0.7
    assert "advice:" not in cli("status", job_id, check=True).stdout


def test_compile_warm_up_is_logged_apart(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, *TRAIN[1:], "--compile", "--output-dir", str(out), "--max-steps", "15"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compiled the model in" in proc.stdout
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    compiled = [r for r in lines if r.get("event") == "compile"]
    assert len(compiled) == 1 and compiled[0]["seconds"] > 0
    steps = [r for r in lines if r.get("event") == "step"]
    assert steps[0]["step"] == 1 and "samples_per_s" not in steps[0]  # the compiling step's window: no rate
    assert all(r["samples_per_s"] > 0 for r in steps[1:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["compile"] is True and summary["compile_s"] == pytest.approx(compiled[0]["seconds"], abs=1e-3)
    assert summary["steps"] == 15
