"""The project's own Slurm cluster (slurm/cluster.sh) is real: two nodes, accounting, idempotent."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "cluster.sh"

pytestmark = pytest.mark.slurm


def test_two_idle_nodes_with_distinct_hostnames(slurm_cluster):
    nodes = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
    assert {ln.split()[0] for ln in nodes if ln.strip()} == {"n1", "n2"}
    hosts = slurm_cluster.run("srun", "-N2", "-n2", "-t", "1", "/bin/hostname").stdout.split()
    assert sorted(hosts) == ["n1", "n2"]


def test_accounting_records_a_finished_job(slurm_cluster):
    job = slurm_cluster.run("sbatch", "--parsable", "-N1", "--output=/dev/null", "--wrap", "/bin/true").stdout.strip()
    deadline = time.monotonic() + 60
    state = ""
    while time.monotonic() < deadline:
        state = slurm_cluster.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State", check=False).stdout.strip()
        if state == "COMPLETED":
            break
        time.sleep(0.5)
    assert state == "COMPLETED"


def test_up_is_idempotent_and_status_reports(slurm_cluster):
    before = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    again = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=120)
    after = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    pids = lambda text: sorted(ln for ln in text.splitlines() if "running (pid" in ln)  # noqa: E731
    assert pids(before.stdout) == pids(after.stdout) and len(pids(after.stdout)) == 6  # nothing restarted
    assert "accounting: on" in after.stdout


def test_bad_usage_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "up", "--bogus"], capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown option --bogus" in proc.stderr
