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


# The trainer and the doctor's probe read it (launcher.train.placement.SHARED_GPUS_ENV): ranks that
# share a GPU cannot use NCCL, and ranks of other simulated nodes on the same GPUs are invisible to them.
SHARED_GPUS_ENV = "DDPJOB_GPUS_SHARED"


def node_gpu_env(gpus: int, nodes: int, procs_per_node: int, node: int) -> dict[str, str]:
    """Env for simulated node ``node`` of a job on one machine with ``gpus`` GPUs: its own GPUs
    (CUDA_VISIBLE_DEVICES) when there are enough for every rank, as separate machines would have;
    else the nodes share them and every rank is told so (a node's own ranks beyond its GPUs the
    trainer sees itself: LOCAL_WORLD_SIZE)."""
    if gpus <= 0:
        return {}
    if gpus >= nodes * procs_per_node:
        first = node * procs_per_node
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(first, first + procs_per_node))}
    return {SHARED_GPUS_ENV: "1"} if nodes > 1 else {}


def shared_gpus_note(gpus: int, nodes: int, procs_per_node: int) -> str:
    """What the plan says when the job's ranks share this machine's GPUs; "" when they do not."""
    ranks = nodes * procs_per_node
    if not 0 < gpus < ranks:
        return ""
    return (f"{ranks} ranks share this machine's {gpus} GPU(s): NCCL takes one rank per GPU (two on one fail "
            f"with 'Duplicate GPU detected'), so the reference trainer and the doctor talk over gloo here "
            f"({SHARED_GPUS_ENV}=1); a program of your own must do the same, or run --nodes 1 with one "
            "process per GPU")


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
