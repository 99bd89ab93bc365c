"""Helpers of the container tests (import by name: ``from enginekit import podman``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_SH = REPO / "docker" / "engine.sh"
SKIP_CODES = {4: "podman cannot be installed here", 5: "podman cannot run a container on this machine"}


def engine_sh(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ENGINE_SH), *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, check=False)


def skip_or_fail(reason: str) -> None:
    """Skip with the reason; under CI=true (where the engine must work) fail instead."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"container tests cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def engine_up() -> None:
    """``docker/engine.sh up`` (podman and the images), or the result .ci/run already had of it;
    skips (fails under CI=true) where the machine cannot, and where .ci/run said to."""
    if os.environ.get("DDPJOB_CONTAINER_SKIP"):
        pytest.skip(os.environ["DDPJOB_CONTAINER_SKIP"])  # set by .ci/run: the build did not fit its budget
    if os.geteuid() != 0:
        skip_or_fail("docker/engine.sh up needs root (apt-get, /etc/containers, rootful podman)")
    ran = os.environ.get("DDPJOB_ENGINE_UP_RC")  # .ci/run ran `up` already (its output is in the CI log)
    if ran is not None:
        code, said = int(ran), "see the CI log above the tests"
    else:
        proc = engine_sh("up")
        code, said = proc.returncode, proc.stderr
    if code in SKIP_CODES:
        skip_or_fail(f"{SKIP_CODES[code]} (docker/engine.sh up exit {code}): {said}")
    assert code == 0, f"docker/engine.sh up exited {code}: {said}"


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
