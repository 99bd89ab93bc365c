"""A user's week (issue 25) on Slurm: rerun, the queue view and Ctrl-C words, on the project's real
private cluster (slurm/cluster.sh; fixture slurm_cluster), through the real command line."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from testkit import run_in_pty, wait_for, wait_for_no_job_processes

pytestmark = [pytest.mark.slurm, pytest.mark.real]

REPO = Path(__file__).resolve().parents[2]
PRINT_SEED = "[python, -c, 'import os; print(\"seed=\" + os.environ[\"SEED\"], flush=True)']"


@pytest.fixture(autouse=True)
def _slurm_env(slurm_cluster, monkeypatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


def write_spec(tmp_path: Path, name: str = "week", **extra: Any) -> Path:
    import yaml

    spec = {"name": name, "workdir": str(REPO), "command": ["python", "-c", "print('hi')"], "nodes": 1,
            "procs_per_node": 1, "env": {"SEED": "1"},
            "slurm": {"folder": str(tmp_path / "slurm"), "time": "10", "signal_delay_s": 15}}
    spec.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_rerun_on_slurm_with_overrides(cli, tmp_path):
    spec = write_spec(tmp_path, env={"SEED": "1", "DB_PASSWORD": "pw-from-file"})
    first = cli("submit", "-q", str(spec), "--target", "slurm", "--set", f"command={PRINT_SEED}", check=True,
                timeout=180).stdout.strip()
    assert cli("wait", first, "--timeout", "240", timeout=300).returncode == 0
    proc = cli("rerun", first, "--set", "env.SEED=2", "--nodes", "2", "-f", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[node0 rank0] seed=2" in proc.stdout and "[node1 rank1] seed=2" in proc.stdout, proc.stdout
    listed = json.loads(cli("list", "-o", "json", check=True, timeout=120).stdout)
    assert listed[0]["rerun_of"] == first and listed[0]["target"] == "slurm" and listed[0]["nodes"] == 2
    assert "pw-from-file" not in cli("status", listed[0]["id"], "-o", "json", check=True, timeout=120).stdout


def test_queue_view_and_cancel_several_on_slurm(cli, tmp_path, ddpjob_home):
    spec = write_spec(tmp_path, "sweep-s", command=["python", "-c", "import time; time.sleep({s})"],
                      sweep={"s": [0, 300]})
    sweep = cli("submit", "-q", str(spec), "--target", "slurm", check=True, timeout=180).stdout.strip()
    lone = cli("submit", "-q", str(write_spec(tmp_path, "lone", command=["sleep", "300"])), "--target", "slurm",
               check=True, timeout=180).stdout.strip()
    wait_for(lambda: "runs 1/2" in cli("list", timeout=120).stdout, "the sweep to show runs 1/2", timeout=240, poll=1)
    (entry,) = json.loads(cli("list", "-o", "json", "--name", "sweep-*", check=True, timeout=120).stdout)
    assert entry["id"] == sweep and entry["runs_done"] == 1 and entry["target"] == "slurm"
    assert [j["id"] for j in json.loads(cli("list", "-o", "json", "--name", "lone", check=True, timeout=120).stdout)] == [lone]
    refused = cli("cancel", sweep, lone, timeout=120)
    assert refused.returncode == 2 and "add --yes" in refused.stderr
    done = cli("cancel", "--all", "--target", "slurm", "--yes", check=True, timeout=180).stdout
    assert f"{sweep}: CANCELLED" in done and f"{lone}: CANCELLED" in done, done
    states = {j["id"]: j["state"] for j in json.loads(cli("list", "-o", "json", check=True, timeout=120).stdout)}
    assert states == {sweep: "CANCELLED", lone: "CANCELLED"}
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel --all", timeout=120)


def test_logs_tail_is_per_node_on_slurm(cli, tmp_path):
    spec = write_spec(tmp_path, "tail", command=["python", "-c", "for i in range(5): print('line', i)"], nodes=2)
    job = cli("submit", "-q", str(spec), "--target", "slurm", check=True, timeout=180).stdout.strip()
    assert cli("wait", job, "--timeout", "240", timeout=300).returncode == 0
    lines = cli("logs", job, "--tail", "1", check=True, timeout=120).stdout.splitlines()
    assert sorted(lines) == ["[node0 rank0] line 4", "[node1 rank1] line 4"], lines


def _ddpjob(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *args]


def test_ctrl_c_words_and_doctor_report_on_slurm(slurm_cluster, cli, tmp_path):
    spec = write_spec(tmp_path, "sleepy", command=["python", "-c", "import time; print('started', flush=True); "
                                                   "time.sleep(300)"])
    code, out = run_in_pty(_ddpjob("submit", str(spec), "--target", "slurm", "-f"), env=dict(os.environ),
                           answers=(("started", "\x03"),), timeout=240)
    job = re.search(r"Submitted (\S+) to slurm", out).group(1)  # type: ignore[union-attr]
    assert code == 130 and f"Ctrl-C: stopped following; {job} keeps running." in out, out
    assert f"ddpjob logs {job} -f" in out and f"ddpjob cancel {job}" in out
    code, out = run_in_pty(_ddpjob("wait", job), env=dict(os.environ), answers=((f"{job}: RUNNING", "\x03"),),
                           timeout=120)
    assert code == 130 and f"wait:    ddpjob wait {job}" in out, out
    assert json.loads(cli("status", job, "-o", "json", check=True, timeout=120).stdout)["state"] == "RUNNING"
    assert cli("cancel", job, timeout=120).returncode == 0

    doc_spec = write_spec(tmp_path, "doc", nodes=2)
    code, out = run_in_pty(_ddpjob("doctor", str(doc_spec), "--target", "slurm", "--max-mib", "4", "--iters", "5"),
                           cwd=tmp_path, env=dict(os.environ), answers=(("waiting for it...", "\x03"),), timeout=240)
    doc = re.search(r"doctor: job (\S+) on slurm", out).group(1)  # type: ignore[union-attr]
    assert code == 130 and f"report:  ddpjob doctor --report {doc}" in out, out
    proc = cli("doctor", "--report", doc, "-o", "json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is (report["verdict"] == []) and [r["iters"] for r in report["results"]] == [5, 5]
    assert any("busbw = algbw" in n for n in report["notes"])
    over_loopback = all(r["address"].startswith("127.") for r in report["ranks"])
    assert report["bandwidth_verdict"].startswith("does not apply") is over_loopback, report["bandwidth_verdict"]


def test_colour_on_a_terminal_on_slurm(cli, tmp_path):
    spec = write_spec(tmp_path, "hue", command=["python", "-c", "print('hi')"], nodes=2)
    env = {**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm"}
    code, out = run_in_pty(_ddpjob("submit", str(spec), "--target", "slurm", "-f"), env=env, timeout=300)
    assert code == 0, out
    job = re.search(r"Submitted (\S+) to slurm", out).group(1)  # type: ignore[union-attr]
    esc = "\x1b["
    assert f"{esc}36m[node0 rank0]{esc}0m hi" in out and f"{esc}33m[node1 rank1]{esc}0m hi" in out, repr(out)
    assert f"{job}: {esc}32mSUCCEEDED{esc}0m" in out
    code, out = run_in_pty(_ddpjob("list"), env=env, timeout=120)
    assert f"{esc}32mSUCCEEDED" in out, repr(out)
    code, out = run_in_pty(_ddpjob("logs", job), env={**env, "NO_COLOR": "1"}, timeout=120)
    assert code == 0 and esc not in out and "[node1 rank1] hi" in out, repr(out)
    assert esc not in cli("logs", job, check=True, timeout=120).stdout
