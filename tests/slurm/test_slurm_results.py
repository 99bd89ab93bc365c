"""``ddpjob results`` on Slurm (issue 26): the runs' metrics files are read from the job folder (on this
machine, the folder the private cluster's nodes share), and a run's duration comes from its metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from testkit import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.real]

SCRIPT = '''
import json, os, sys, time
lr = float(sys.argv[1])
if os.environ["RANK"] == "0":
    with open(os.environ["DDPJOB_METRICS_FILE"], "a") as f:
        for step in range(1, 5):
            f.write(json.dumps({"step": step, "loss": 1.0 / (step * lr), "time": time.time()}) + "\\n")
            f.flush()
            time.sleep(0.2)
'''


def test_results_of_a_slurm_array_from_the_job_folder(slurm_cluster, cli, tmp_path, monkeypatch):
    for key, value in slurm_cluster.env.items():  # the ddpjob subprocesses talk to the test cluster
        monkeypatch.setenv(key, value)
    (tmp_path / "mine.py").write_text(SCRIPT)
    spec = tmp_path / "mine.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "mine", "workdir": str(tmp_path), "command": ["python", "mine.py", "{lr}"], "nodes": 1,
        "sweep": {"lr": [0.5, 2.0]}, "slurm": {"folder": str(tmp_path / "slurm"), "time": "10"}}))
    proc = cli("submit", str(spec), "--target", "slurm", "-q", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    assert cli("wait", job_id, "--timeout", "300", timeout=330).returncode == 0

    def results() -> list[dict]:
        out = cli("results", job_id, "-o", "json", timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["runs"]

    runs = wait_for(lambda: (r := results()) and all(x["final"] for x in r) and r, "both runs' metrics")
    job_dir = json.loads(cli("status", job_id, "-o", "json", timeout=120).stdout)["handle"]["job_dir"]
    assert [(r["values"], r["state"], r["output_dir"]) for r in runs] == [
        ({"lr": 0.5}, "SUCCEEDED", f"{job_dir}/output/sweep-0"), ({"lr": 2.0}, "SUCCEEDED", f"{job_dir}/output/sweep-1")]
    assert [r["final"] for r in runs] == [{"loss": 0.5}, {"loss": 0.125}]
    assert [r["best"] for r in runs] == [{"loss": 0.5}, {"loss": 0.125}]
    for r in runs:  # Slurm records no run times: from the metrics file's first to last time
        lines = [json.loads(x) for x in Path(r["output_dir"], "metrics.jsonl").read_text().splitlines()]
        assert r["duration_s"] == pytest.approx(lines[-1]["time"] - lines[0]["time"]) and r["duration_s"] > 0
