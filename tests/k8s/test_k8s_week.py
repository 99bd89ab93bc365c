"""A user's week (issue 25) on Kubernetes: rerun, the queue view and Ctrl-C words, through the real
kubernetes client against the loopback API server (tests/k8s/fake_apiserver.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRINT_SEED = "[python, -c, 'import os; print(\"seed=\" + os.environ[\"SEED\"], flush=True)']"


def ddpjob(*args: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ddpjob {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


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
