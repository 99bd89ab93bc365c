"""A user's week (issue 25) on Kubernetes: rerun, the queue view and Ctrl-C words, through the real
kubernetes client against the loopback API server (tests/k8s/fake_apiserver.py)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from testkit import run_in_pty, wait_for

from tests.k8s.test_k8s_target import ddpjob

REPO = Path(__file__).resolve().parents[2]
PRINT_SEED = "[python, -c, 'import os; print(\"seed=\" + os.environ[\"SEED\"], flush=True)']"


def submit(*args: str) -> str:
    return ddpjob("submit", "-q", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *args,
                  check=True).stdout.strip()


def test_rerun_on_kubernetes_with_overrides_records_where_it_came_from(k8s_api):
    first = submit("--nodes", "1", "--set", f"command={PRINT_SEED}", "--set", "env.SEED=1")
    assert ddpjob("wait", first, "--timeout", "240").returncode == 0
    proc = ddpjob("rerun", first, "--set", "env.SEED=2", "--nodes", "2", "-f", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[master-0 rank0] seed=2" in proc.stdout and "[worker-0 rank1] seed=2" in proc.stdout, proc.stdout
    second = re.search(r"Submitted (\S+) to k8s", proc.stdout).group(1)  # type: ignore[union-attr]
    assert k8s_api.server.job(second)["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    listed = {j["id"]: j for j in json.loads(ddpjob("list", "-o", "json", check=True).stdout)}
    assert listed[second]["rerun_of"] == first and listed[first]["rerun_of"] is None
    assert json.loads(ddpjob("status", second, "-o", "json", check=True).stdout)["rerun_of"] == first
    # --target: the same recorded spec planned for another target.
    local = ddpjob("rerun", first, "--target", "local", "--dry-run", check=True).stdout
    assert "torchrun" in local and "kind: PyTorchJob" not in local


def test_queue_view_and_cancel_several_on_kubernetes(k8s_api):
    sweep = submit("--nodes", "1", "--name", "sweep-k", "--set", "sweep={s: [0, 300]}",
                   "--set", "command=[python, -c, 'import time; time.sleep({s})']")
    lone = submit("--nodes", "1", "--name", "lone", "--set", "command=[python, -c, 'import time; time.sleep(300)']")
    wait_for(lambda: "runs 1/2" in ddpjob("list", check=True).stdout, "the sweep to show runs 1/2")
    row = next(ln for ln in ddpjob("list", check=True).stdout.splitlines() if ln.startswith(sweep))
    assert re.search(rf"^{sweep}\s+k8s\s+RUNNING\s+1\s+\S+\s+\S+\s+runs 1/2", row), row
    (entry,) = json.loads(ddpjob("list", "-o", "json", "--name", "sweep-*", "--target", "k8s", check=True).stdout)
    assert entry["id"] == sweep and entry["runs_done"] == 1 and entry["age_s"] >= 0
    assert json.loads(ddpjob("list", "-o", "json", "--target", "local", check=True).stdout) == []
    refused = ddpjob("cancel", sweep, lone)
    assert refused.returncode == 2 and "add --yes" in refused.stderr
    assert k8s_api.server.job(lone) is not None
    done = ddpjob("cancel", "--all", "--target", "k8s", "--state", "running", "--yes", check=True).stdout
    assert f"{sweep}: CANCELLED" in done and f"{lone}: CANCELLED" in done, done
    assert k8s_api.server.job(lone) is None and k8s_api.server.jobs == {}


def test_logs_tail_is_per_pod_on_kubernetes(k8s_api):
    # Both pods print, then meet (the job ends when the master does, and may take the worker with it).
    prog = ("import torch.distributed as d; d.init_process_group('gloo'); "
            "[print('line', i, flush=True) for i in range(5)]; d.barrier()")
    job = submit("--nodes", "2", "--set", f"command=[python, -c, {json.dumps(prog)}]")
    assert ddpjob("logs", job, "-f", timeout=240).returncode == 0  # every pod's lines saved as they come
    lines = ddpjob("logs", job, "--tail", "1", check=True).stdout.splitlines()
    assert sorted(lines) == ["[master-0 rank0] line 4", "[worker-0 rank1] line 4"], lines


def test_ctrl_c_words_and_doctor_report_on_kubernetes(k8s_api, tmp_path):
    sleeper = "command=[python, -c, 'import time; print(\"started\", flush=True); time.sleep(300)']"
    argv = [sys.executable, "-m", "launcher", "submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s",
            "--nodes", "1", "--set", sleeper, "-f"]
    code, out = run_in_pty(argv, cwd=REPO, env=dict(os.environ), answers=(("started", "\x03"),))
    job = re.search(r"Submitted (\S+) to k8s", out).group(1)  # type: ignore[union-attr]
    assert code == 130 and f"Ctrl-C: stopped following; {job} keeps running." in out, out
    assert f"ddpjob logs {job} -f" in out and f"ddpjob cancel {job}" in out
    code, out = run_in_pty([sys.executable, "-m", "launcher", "wait", job], env=dict(os.environ),
                           answers=((f"{job}: RUNNING", "\x03"),))
    assert code == 130 and f"wait:    ddpjob wait {job}" in out, out
    assert k8s_api.server.job(job) is not None and ddpjob("cancel", job).returncode == 0

    code, out = run_in_pty([sys.executable, "-m", "launcher", "doctor", str(REPO / "jobs" / "quickstart.yaml"),
                            "--target", "k8s", "--nodes", "2",
                            "--max-mib", "4", "--iters", "5"], cwd=tmp_path, env=dict(os.environ),
                           answers=(("waiting for it...", "\x03"),))
    doc = re.search(r"doctor: job (\S+) on k8s", out).group(1)  # type: ignore[union-attr]
    assert code == 130 and f"report:  ddpjob doctor --report {doc}" in out, out
    report = json.loads(ddpjob("doctor", "--report", doc, "-o", "json", timeout=300, check=True).stdout)
    assert report["ok"] is True and [r["iters"] for r in report["results"]] == [5, 5]
    assert "bandwidth_verdict" in report and any("busbw = algbw" in n for n in report["notes"])


def test_colour_on_a_terminal_on_kubernetes(k8s_api):
    prog = ("import torch.distributed as d; d.init_process_group('gloo'); print('hi', flush=True); d.barrier()")
    job = submit("--nodes", "2", "--set", f"command=[python, -c, {json.dumps(prog)}]")
    env = {**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm"}
    code, out = run_in_pty([sys.executable, "-m", "launcher", "logs", job, "-f"], env=env, timeout=240)
    assert code == 0, out
    esc = "\x1b["
    assert f"{esc}36m[master-0 rank0]{esc}0m hi" in out and f"{esc}33m[worker-0 rank1]{esc}0m hi" in out, repr(out)
    assert f"{job}: {esc}32mSUCCEEDED{esc}0m" in out
    code, out = run_in_pty([sys.executable, "-m", "launcher", "logs", job], env={**env, "NO_COLOR": "1"})
    assert code == 0 and esc not in out and "[worker-0 rank1] hi" in out, repr(out)
    assert esc not in ddpjob("list", check=True).stdout
