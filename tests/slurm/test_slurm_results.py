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
    """Then (issue 36) the same program's runs across three jobs: two local ones and this Slurm sweep."""
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
    tasks = json.loads(cli("status", job_id, "-o", "json", timeout=120).stdout)["status"]["tasks"]
    for r, t in zip(runs, tasks, strict=True):  # sacct's Start to End (whole seconds), around the metrics' span
        lines = [json.loads(x) for x in Path(r["output_dir"], "metrics.jsonl").read_text().splitlines()]
        assert r["duration_s"] == pytest.approx(t["ended"] - t["started"]) and r["duration_s"] > 0, (r, t)
        assert r["duration_s"] >= lines[-1]["time"] - lines[0]["time"] - 1, (r, lines)

    # Two local jobs of the same program, side by side with the Slurm sweep: one row and one curve per run,
    # what differs as columns (the target, the command's value, an env value, the sweep's lr).
    local = [cli("submit", "--nodes", "1", "-q", "-f", *extra, "--", "python", "mine.py", lr, cwd=tmp_path, timeout=180)
             for lr, extra in (("0.5", ()), ("2.0", ("--set", "env.MODE=fast")))]
    a, b = (p.stdout.strip().splitlines()[0] for p in local)
    assert [p.returncode for p in local] == [0, 0], [p.stderr for p in local]
    out = cli("results", a, b, job_id, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    shared, header, *rows = out.stdout.splitlines()
    assert shared.startswith("shared: ") and "nodes=1" in shared and "procs=1" in shared and "target=" not in shared
    assert header.split()[:2] == ["RUN", "target"] and "env.MODE" in header and "lr" in header.split()
    cells = [row.split() for row in rows]
    assert [(c[0], c[1]) for c in cells] == [(a, "local"), (b, "local"), (f"{job_id}/0", "slurm"), (f"{job_id}/1", "slurm")]
    data = json.loads(cli("results", a, b, job_id, "-o", "json", timeout=120).stdout)
    assert data["ids"] == [a, b, job_id] and {"target", "command", "env.MODE", "lr"} <= set(data["differing"])
    assert [(r["label"], r["differs"]["env.MODE"], r["differs"]["lr"], r["final"]["loss"]) for r in data["runs"]] == [
        (a, "-", "-", 0.5), (b, "fast", "-", 0.125), (f"{job_id}/0", "-", "0.5", 0.5), (f"{job_id}/1", "-", "2.0", 0.125)]
    assert data["shared"]["procs"] == "1" and data["notes"] == []
    csv_rows = cli("results", a, b, job_id, "-o", "csv", timeout=120).stdout.splitlines()
    assert csv_rows[0].startswith("job,run,index,target,") and len(csv_rows) == 5
    svg = tmp_path / "three.svg"
    plotted = cli("plot", a, b, job_id, "-o", str(svg), timeout=120)
    assert plotted.returncode == 0 and f"wrote {svg}: loss of 4 task(s) of 3 jobs" in plotted.stdout, plotted.stderr
    legend = [line for line in svg.read_text().splitlines() if "target=" in line]
    for label in (a, b, f"{job_id}/0", f"{job_id}/1"):
        assert any(f">{label}: target=" in line for line in legend), (label, legend)
    assert any("env.MODE=fast" in line for line in legend) and any("lr=2.0" in line for line in legend)
