"""A user's day: the Python API, live progress, shell completion, compact list, rm/prune, doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from testkit import marked_sweep

REPO = Path(__file__).resolve().parents[2]

API_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from launcher import api

    job = api.submit("jobs/quickstart.yaml", target="local", nodes=2, overrides={"env.NOTE": "from the api"})
    seen = None
    deadline = time.time() + 240
    while time.time() < deadline:
        st = job.status()
        if st.state.terminal:
            break
        time.sleep(0.5)
    state = job.wait(timeout=240)
    rank1 = list(job.logs(rank=1))
    again = api.get(job.id)
    listed = [j.id for j in api.list_jobs()]
    try:
        api.submit({"name": "bad", "command": ["python", "t.py"], "nodes": 0})
    except api.SpecError as e:
        issue = [i.dotted for i in e.issues]
    print(json.dumps({"id": job.id, "state": state.value, "rank1": rank1[-3:], "rank1_count": len(rank1),
                      "again": again.id, "listed": listed, "issue": issue, "target": again.target}))
""")


@pytest.mark.real
def test_the_python_api_submits_waits_reads_logs_and_finds_the_job(tmp_path):
    script = tmp_path / "use_api.py"
    script.write_text(API_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["state"] == "SUCCEEDED" and out["again"] == out["id"] and out["listed"] == [out["id"]]
    assert out["rank1_count"] > 0 and all(line.startswith("[node1 rank1]") for line in out["rank1"]), out["rank1"]
    assert out["issue"] == ["nodes"] and out["target"] == "local"


@pytest.mark.real
def test_progress_while_the_quickstart_runs_and_a_compact_list(cli):
    job_id = cli("submit", "-q", "jobs/quickstart.yaml", "--nodes", "2", check=True).stdout.strip()
    deadline = time.monotonic() + 240
    progress = None
    while time.monotonic() < deadline:
        data = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        if data["progress"] and data["progress"]["step"] > 0 and data["state"] == "RUNNING":
            progress = data["progress"]
            break
        assert data["state"] in ("PENDING", "RUNNING"), data
        time.sleep(0.5)
    assert progress is not None, "no progress seen while the job ran"
    assert progress["total_steps"] >= progress["step"] and "loss" in progress and "samples_per_s" in progress
    assert "progress: step " in cli("status", job_id, check=True).stdout
    listing = cli("list", "-o", "json", check=True).stdout
    (entry,) = json.loads(listing)
    assert len(listing.encode()) < 2048 and "spec" not in entry and "handle" not in entry
    assert entry["id"] == job_id and entry["nodes"] == 2 and entry["created"].endswith("+00:00")
    assert cli("wait", job_id, "--timeout", "240").returncode == 0
    assert json.loads(cli("list", "-o", "json", check=True).stdout)[0]["state"] == "SUCCEEDED"


SWEEP_STAGE = """
import json, os, sys, time
i, marks = sys.argv[1], os.environ["MARKS"]
if i == "1":  # the second run: starting, no step yet, until the test lets it write one
    open(os.path.join(marks, "started-1"), "w").close()
    while not os.path.exists(os.path.join(marks, "go-1")):
        time.sleep(0.1)
steps = [(1, 16), (16, 16)] if i == "0" else [(3, 16)]
with open(os.environ["DDPJOB_METRICS_FILE"], "a") as f:
    for step, total in steps:
        f.write(json.dumps({"step": step, "total_steps": total, "time": time.time()}) + "\\n")
if i == "1":
    while not os.path.exists(os.path.join(marks, "go-2")):
        time.sleep(0.1)
"""


@pytest.mark.real
def test_a_sweeps_progress_is_the_run_that_trains_now(cli, tmp_path):
    """Once the first run of a sweep has finished ("step 16/16, ETA 0s"), the progress is the second
    run's: nothing while it starts, then its own steps."""
    marks, job_id = marked_sweep(cli, tmp_path, "prog", SWEEP_STAGE)
    deadline = time.monotonic() + 120
    while not (marks / "started-1").exists():
        assert time.monotonic() < deadline, "the second run did not start"
        time.sleep(0.1)

    def progress() -> dict | None:
        data = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        assert data["state"] == "RUNNING", data
        return data["progress"]

    try:
        assert progress() is None  # not the first run's last step
        (marks / "go-1").touch()
        deadline = time.monotonic() + 60
        while (now := progress()) is None:
            assert time.monotonic() < deadline, "no progress from the second run"
            time.sleep(0.1)
        assert (now["task"], now["step"]) == (1, 3), now
    finally:
        (marks / "go-1").touch()
        (marks / "go-2").touch()
    assert cli("wait", job_id, "--timeout", "120").returncode == 0


@pytest.mark.real
def test_completion_lists_job_ids_newest_first(cli, tmp_path):
    ids = [cli("submit", "-q", "--no-preflight", "--name", f"c{i}", "--", "python", "-c", "pass", cwd=tmp_path,
               check=True).stdout.strip() for i in range(2)]
    env = {**os.environ, "COMP_WORDS": "ddpjob status ", "COMP_CWORD": "2", "_DDPJOB_COMPLETE": "bash_complete"}
    out = subprocess.run([sys.executable, "-m", "launcher"], env=env, capture_output=True, text=True, check=True).stdout
    assert [line.split(",", 1)[1] for line in out.splitlines()] == ids[::-1]
    env["COMP_WORDS"], env["COMP_CWORD"] = "ddpjob submit --target ", "3"
    out = subprocess.run([sys.executable, "-m", "launcher"], env=env, capture_output=True, text=True, check=True).stdout
    assert {line.split(",", 1)[1] for line in out.splitlines()} == {"local", "slurm", "k8s"}
    for shell in ("bash", "zsh", "fish"):
        script = cli("completion", shell, check=True).stdout
        assert "_DDPJOB_COMPLETE" in script
    for job_id in ids:
        cli("wait", job_id, "--timeout", "120")


@pytest.mark.real
def test_rm_and_prune_leave_no_record_and_no_run_directory(cli, tmp_path, ddpjob_home):
    a, b, c = (cli("submit", "-q", "--name", n, "--", "python", "-c", "pass", cwd=tmp_path, check=True).stdout.strip()
               for n in ("a", "b", "c"))
    for job_id in (a, b, c):
        assert cli("wait", job_id, "--timeout", "120").returncode == 0
    runs = ddpjob_home / "runs"
    assert (runs / a).is_dir()
    listed = next(line for line in cli("list", "--du", check=True).stdout.splitlines() if line.startswith(a))
    out = cli("rm", a, check=True).stdout
    assert f"{a}: removed" in out and not (runs / a).exists()
    # The size rm freed, written as list --du wrote it (issue 45 item 8: "0.0 MiB freed" beside "10.8K").
    freed = out.split("removed (")[1].split(" freed")[0]
    assert freed != "0.0M" and freed in listed.split(), (out, listed)
    assert cli("status", a).returncode == 4
    dry = cli("prune", "--older-than", "0", "--dry-run", check=True).stdout
    assert "2 job(s)" in dry and (runs / b).is_dir()
    assert "2 job(s)" in cli("prune", "--older-than", "0", check=True).stdout
    assert not (runs / b).exists() and not (runs / c).exists()
    assert "no jobs yet" in cli("list", check=True).stdout
    live = cli("submit", "-q", "--name", "live", "--", "python", "-c", "import time; time.sleep(60)", cwd=tmp_path,
               check=True).stdout.strip()
    refused = cli("rm", live)
    assert refused.returncode == 2 and "rm --force" in refused.stderr and (runs / live).is_dir()
    assert cli("rm", "--force", live).returncode == 0 and not (runs / live).exists()
    assert cli("prune", "--older-than", "soon").returncode == 2


@pytest.mark.real
def test_doctor_measures_all_reduce_on_two_local_nodes(cli, tmp_path):
    proc = cli("doctor", "--target", "local", "--nodes", "2", "--max-mib", "64", "-o", "json", cwd=tmp_path,
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    sizes = [r["bytes"] for r in report["results"]]
    assert sizes[0] == 2**20 and sizes[-1] == 64 * 2**20
    assert all(r["algbw_gbps"] > 0 and r["busbw_gbps"] > 0 for r in report["results"])
    assert report["ranks"][0]["env"]["GLOO_SOCKET_IFNAME"] == "lo" and report["verdict"] == []


@pytest.mark.parametrize("lines,expected", [
    ([{"step": 1, "time": 100.0, "total_steps": 11, "loss": 2.0}, {"step": 6, "time": 110.0, "loss": 1.0}],
     {"step": 6, "total_steps": 11, "loss": 1.0, "eta_s": 10.0}),
    ([{"event": "resume", "step": 4}, {"step": "x"}], {"step": 4}),
    ([], None),
])
def test_progress_from_a_metrics_file(tmp_path, lines, expected):
    from launcher.core.progress import describe, read_progress

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json\n")
    got = read_progress(str(path))
    if expected is None:
        assert got is None and describe(got) == ""
        return
    assert {k: got.to_json()[k] for k in expected} == expected
    assert describe(got).startswith(f"step {expected['step']}")
