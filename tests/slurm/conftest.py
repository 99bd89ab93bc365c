"""The private 3-node Slurm cluster (slurm/cluster.sh) as pytest fixtures.

``slurm_cluster`` (session scope) runs ``slurm/cluster.sh up``: it starts the cluster, installing
Debian's packages if needed, or reuses a running one (``up`` is idempotent), and at the end of the
session stops it again only if this session started it. It yields a :class:`SlurmCluster`:

* ``root``: the cluster's private directory (``$DDPJOB_SLURM_ROOT``, default ``${TMPDIR:-/tmp}/ddpjob-slurm``)
* ``env``: what a Slurm client needs on top of ``os.environ`` (``{"SLURM_CONF": ...}``; PATH unchanged)
* ``accounting``: whether slurmdbd accounting is on (``sacct`` works)
* ``run(*argv)``: run a client command (sbatch, squeue, sacct, scontrol ...) against the cluster
* ``script(*args, env=None)``: run ``slurm/cluster.sh`` (status, up, ...); raises on failure
* ``set_accounting(on)``: restart slurmctld/slurmd with accounting on or off (``cluster.sh up
  [--no-accounting]``); running job steps survive, munge/MariaDB/slurmdbd stay up

``slurm_no_accounting`` (function scope) is the same cluster with accounting switched off for one
test, and back on afterwards.

Tests skip only where the cluster cannot exist (not root; the packages are missing and cannot be
installed: the script exits 4). With CI=true they fail instead, so CI cannot silently skip them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "cluster.sh"
CANNOT_INSTALL = 4  # cluster.sh's exit code: not root / packages missing and not installable
CANNOT_APART = 5  # cluster.sh up --apart: this kernel cannot make the namespaces, bridge or veths


class ClusterScriptError(RuntimeError):
    def __init__(self, args: tuple[str, ...], proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode = proc.returncode
        super().__init__(f"slurm/cluster.sh {' '.join(args)} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout}\n{proc.stderr}")


def cluster_script(*args: str, env: dict[str, str] | None = None, timeout: float = 900,
                   check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``slurm/cluster.sh ARGS`` (stdin closed, so it can never wait on a terminal)."""
    proc = subprocess.run(["bash", str(SCRIPT), *args], check=False, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterScriptError(args, proc)
    return proc


def cluster_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables ``cluster.sh env`` tells a client to export (SLURM_CONF)."""
    out: dict[str, str] = {}
    for line in cluster_script("env", env=env).stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            out[key] = value
    return out


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` holds what a client needs (SLURM_CONF)."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    accounting: bool = True
    # Apart mode: {node: its address on the cluster's private bridge}; {} when the nodes share loopback.
    addresses: dict[str, str] = field(default_factory=dict)
    # Why the nodes are not apart (the machine cannot, or DDPJOB_SLURM_MODE=together); "" when they are.
    not_apart: str = ""

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sbatch, squeue, sacct, scontrol ...) against this cluster."""
        return subprocess.run(list(args), env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, check=check, timeout=timeout)

    @staticmethod
    def script(*args: str, env: dict[str, str] | None = None, timeout: float = 900,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        """``slurm/cluster.sh ARGS`` (``env`` on top of os.environ, e.g. another DDPJOB_SLURM_ROOT)."""
        return cluster_script(*args, env=env, timeout=timeout, check=check)

    @staticmethod
    def client_env(env: dict[str, str] | None = None) -> dict[str, str]:
        """What ``cluster.sh env`` exports (for another root/port: pass ``env``)."""
        return cluster_env(env)

    def set_accounting(self, on: bool) -> None:
        """Restart slurmctld and the slurmds with accounting storage on or off (munge, MariaDB and
        slurmdbd stay up; job steps that run go on). Takes about a second."""
        if on == self.accounting:
            return
        cluster_script("up", *([] if on else ["--no-accounting"]))
        self.accounting = on


def _unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "the private Slurm cluster needs root (apt-get, /etc/hosts, slurmd as root)"
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm tests cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def _node_addresses(status_stdout: str) -> dict[str, str]:
    """{node: address} from ``cluster.sh status``'s "nodes: apart (n1 10.x.77.1, n2 ..., controller ...)"."""
    line = next((x for x in status_stdout.splitlines() if x.startswith("nodes: apart")), "")
    return dict(re.findall(r"\b(n\d+) (\d+\.\d+\.\d+\.\d+)", line))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The cluster, its nodes apart (own network namespaces and addresses) wherever this machine
    can make them; ``DDPJOB_SLURM_MODE=together`` runs every test on the loopback layout instead."""
    reason = _unavailable_reason()
    if reason:
        _skip_or_fail(reason)
    was_running = cluster_script("status", check=False).returncode == 0
    together = os.environ.get("DDPJOB_SLURM_MODE", "apart") == "together"
    not_apart = "DDPJOB_SLURM_MODE=together" if together else ""
    try:
        try:
            cluster_script("up", "--together" if together else "--apart")
        except ClusterScriptError as exc:
            if exc.returncode != CANNOT_APART:
                raise
            not_apart = f"this machine cannot put the nodes apart: {exc}"
            cluster_script("up", "--together")
    except ClusterScriptError as exc:
        if exc.returncode == CANNOT_INSTALL:
            _skip_or_fail(f"Slurm packages cannot be installed here: {exc}")
        raise
    env = cluster_env()
    cluster = SlurmCluster(root=Path(env["SLURM_CONF"]).parents[1], env=env, accounting=True,
                           addresses=_node_addresses(cluster_script("status").stdout), not_apart=not_apart)
    if not not_apart and len(cluster.addresses) != 3:
        raise AssertionError(f"cluster.sh up --apart left no node addresses in its status: {cluster.addresses}")
    yield cluster
    if not was_running:
        cluster_script("down")
    elif not cluster.accounting:
        cluster_script("up")  # leave it as we found it: running, accounting on


@pytest.fixture
def apart_cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster with its nodes apart; skips (fails under CI=true) with the reason where they are not."""
    if slurm_cluster.not_apart:
        _skip_or_fail(f"the Slurm nodes are not apart: {slurm_cluster.not_apart}")
    return slurm_cluster


@pytest.fixture
def cut(apart_cluster: SlurmCluster) -> Iterator[Callable[[str], None]]:
    """Cuts a node's link (``cut("n2")``); restores it after the test, whatever happened."""
    cuts: list[str] = []

    def do(node: str) -> None:
        apart_cluster.script("link", node, "down")
        cuts.append(node)

    yield do
    for node in cuts:
        apart_cluster.script("link", node, "up")


@pytest.fixture
def slurm_no_accounting(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with accounting storage off for one test (restored afterwards)."""
    slurm_cluster.set_accounting(False)
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.set_accounting(True)
