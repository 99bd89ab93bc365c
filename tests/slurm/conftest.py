"""The private 2-node Slurm cluster (slurm/cluster.sh) as a pytest fixture.

``slurm_cluster`` starts the cluster for the session (installing Debian's packages if needed)
and stops it afterwards if this session started it. Tests skip only where the cluster cannot
exist (not root, no apt); under CI=true they fail instead, so CI cannot silently skip them.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "cluster.sh"


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` holds what a client needs (SLURM_CONF)."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    accounting: bool = True

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sbatch, squeue, sacct, scontrol ...) against this cluster."""
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def set_accounting(self, on: bool) -> None:
        """Restart the Slurm daemons with accounting storage on or off (munge and MariaDB stay up)."""
        if on == self.accounting:
            return
        _script("up", *([] if on else ["--no-accounting"]))
        self.accounting = on


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"slurm/cluster.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "the private Slurm cluster needs root (apt-get, /etc/hosts, slurmd)"
    if not Path("/usr/bin/apt-get").exists() and not Path("/usr/sbin/slurmctld").exists():
        return "no apt-get to install Debian's Slurm packages"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    reason = _unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm tests cannot run: {reason}")
        pytest.skip(reason)
    root = Path(os.environ.get("DDPJOB_SLURM_ROOT") or Path(os.environ.get("TMPDIR", "/tmp")) / "ddpjob-slurm")
    was_running = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True).returncode == 0
    _script("up")
    cluster = SlurmCluster(root=root, env={"SLURM_CONF": str(root / "etc" / "slurm.conf")}, accounting=True)
    yield cluster
    if not cluster.accounting:
        _script("up")
    if not was_running:
        _script("down")
