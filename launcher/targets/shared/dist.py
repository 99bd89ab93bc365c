"""The one place where the processes' NCCL/Gloo and threading environment is decided.

Pure functions of the spec and what the target declares (its NCCL/Gloo defaults, its cores per
node). Precedence, lowest first: the target's defaults, the spec's ``nccl:`` section, the spec's
``env:``. Each target keeps its own rendezvous rule (local: a reserved free port; Slurm: derived
from the job id inside the job; Kubernetes: what the operator injects). ddpjob never sets what
torchrun computes per process (RANK, LOCAL_RANK, WORLD_SIZE, ...).
"""

from __future__ import annotations

from launcher.spec.model import JobSpec


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


def nccl_env(spec: JobSpec, defaults: dict[str, str]) -> dict[str, str]:
    """NCCL/Gloo variables: the target's ``defaults``, then the spec's ``nccl:`` section."""
    env = dict(defaults)
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
    defaults: dict[str, str],
    *,
    cpus_per_node: int | None,
    procs_per_node: int,
    omp_override: int | None = None,
) -> dict[str, str]:
    """Every variable ddpjob adds for the processes of one node, user values winning.

    Args:
        defaults: the target's NCCL/Gloo defaults (each target declares its own).
        cpus_per_node: cores one node may use (None: unknown, OMP_NUM_THREADS=1 as torchrun does).
        procs_per_node: resolved processes per node.
        omp_override: an explicit OMP_NUM_THREADS (e.g. ``local.omp_num_threads``).
    """
    env = nccl_env(spec, defaults)
    env["OMP_NUM_THREADS"] = str(omp_override or omp_threads(cpus_per_node, procs_per_node))
    env["PYTHONUNBUFFERED"] = "1"
    if spec.stall.action == "fail":  # collectives give up too (the reference trainer reads it)
        env["DDPJOB_COLLECTIVE_TIMEOUT_S"] = str(spec.stall.timeout_s)
    env.update(spec.env)
    for name in spec.env_from_host:  # the processes inherit these from the submitting shell
        env.pop(name, None)
    return env
