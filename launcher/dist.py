"""The one place where rendezvous and NCCL/Gloo environment are decided for each target.

Pure functions of (spec, target, context). Precedence, lowest first: target defaults, the spec's
``nccl:`` section, the spec's ``env:``. ddpjob never sets what torchrun computes per process
(RANK, LOCAL_RANK, WORLD_SIZE, ...): torchrun sets those for every worker it starts.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Literal

from launcher.spec import JobSpec

TargetName = Literal["local", "slurm", "k8s"]

# Kubernetes: the operator injects MASTER_ADDR/PORT from the Master's port named pytorchjob-port.
K8S_DEFAULT_PORT = 29500
# Slurm: ports derived from the job id fall in this range (below the usual ephemeral range 32768+).
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000

_NCCL_DEFAULTS: dict[str, dict[str, str]] = {
    "local": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"},
    "slurm": {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"},
    "k8s": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"},
}


def resolve_procs_per_node(spec: JobSpec, gpus_per_node: int) -> int:
    """``procs_per_node``, with ``auto`` meaning one process per GPU, or 1 on a CPU-only node."""
    if spec.procs_per_node == "auto":
        return gpus_per_node if gpus_per_node > 0 else 1
    return spec.procs_per_node


def omp_threads(cpus_per_node: int | None, procs_per_node: int) -> int:
    """Threads per process so that the processes of one node share its cores without oversubscribing.

    torchrun sets OMP_NUM_THREADS=1 with a warning when it starts several processes; on a CPU
    node that wastes cores, and with none set each process would take every core.
    """
    if not cpus_per_node:
        return 1
    return max(1, cpus_per_node // max(1, procs_per_node))


def nccl_env(spec: JobSpec, target: TargetName, *, rdma: bool = False) -> dict[str, str]:
    """NCCL/Gloo variables for ``target``: target defaults, then the spec's ``nccl:`` section."""
    env = dict(_NCCL_DEFAULTS[target])
    if target == "k8s" and rdma:
        env["NCCL_IB_DISABLE"] = "0"
    n = spec.nccl
    if n.debug is not None:
        env["NCCL_DEBUG"] = n.debug
    if n.ib_disable is not None:
        env["NCCL_IB_DISABLE"] = "1" if n.ib_disable else "0"
    if n.socket_ifname is not None:
        env["NCCL_SOCKET_IFNAME"] = n.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = n.socket_ifname
    env.update(n.extra)
    return env


def process_env(
    spec: JobSpec,
    target: TargetName,
    *,
    cpus_per_node: int | None,
    procs_per_node: int,
    omp_override: int | None = None,
    rdma: bool = False,
) -> dict[str, str]:
    """Every variable ddpjob adds for the processes of one node, user values winning.

    Args:
        cpus_per_node: cores one node may use (None: unknown, OMP_NUM_THREADS=1 as torchrun does).
        procs_per_node: resolved processes per node.
        omp_override: an explicit OMP_NUM_THREADS (e.g. ``local.omp_num_threads``).
    """
    env = nccl_env(spec, target, rdma=rdma)
    env["OMP_NUM_THREADS"] = str(omp_override or omp_threads(cpus_per_node, procs_per_node))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(spec.env)
    return env


@dataclass(frozen=True)
class Rendezvous:
    """Where torchrun agents meet. ``addr`` may be a shell expression resolved inside a Slurm job."""

    addr: str
    port: int


def local_rendezvous(spec: JobSpec, free_port: int) -> Rendezvous:
    """Local: loopback, the spec's port or one free at submit time (chosen by the registry)."""
    return Rendezvous("127.0.0.1", spec.master_port or free_port)


def slurm_port(job_id: int | str, array_index: int | str | None = None) -> int:
    """A port derived from the Slurm job id (and array index) so concurrent jobs do not collide.

    Consecutive job ids map to consecutive ports; array elements are spread by a hash so that
    element k of job j and element 0 of job j+k do not meet.
    """
    key = f"{job_id}" if array_index in (None, "") else f"{job_id}_{array_index}"
    try:
        base = int(job_id)
    except (TypeError, ValueError):
        base = zlib.crc32(str(job_id).encode())
    offset = base if array_index in (None, "") else base + zlib.crc32(key.encode())
    return SLURM_PORT_BASE + offset % SLURM_PORT_SPAN


def k8s_port(spec: JobSpec) -> int:
    """Kubernetes: every pod has its own network namespace, so a fixed port never clashes."""
    return spec.master_port or K8S_DEFAULT_PORT
