"""Helpers of the container tests (import by name: ``from enginekit import podman``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_SH = REPO / "docker" / "engine.sh"
SKIP_CODES = {4: "podman cannot be installed here", 5: "podman cannot run a container on this machine"}


def engine_sh(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ENGINE_SH), *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, check=False)


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def job_ids(home: Path) -> list[str]:
    runs = home / "runs"
    return [p.name for p in runs.iterdir()] if runs.is_dir() else []


def job_networks(home: Path) -> list[str]:
    """Networks (local.network: bridge) named after a job of registry ``home``."""
    ids = job_ids(home)
    if not ids:
        return []
    names = podman("network", "ls", "--format", "{{.Name}}").stdout.split()
    return [n for n in names if n in {f"ddpjob-{i}" for i in ids}]


def job_containers(home: Path) -> list[str]:
    """Containers (any state) named after a job of registry ``home``."""
    ids = job_ids(home)
    if not ids:
        return []
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return [n for n in names if any(n.startswith(f"ddpjob-{i}-") for i in ids)]
