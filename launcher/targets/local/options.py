"""The ``local:`` section of a job spec (options used only by the local target)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from launcher.core.plugins import TargetPlugin


class LocalOptions(BaseModel):
    """Options for ``--target local`` (torchrun agents on this machine, one per simulated node)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    stop_on_failure: bool = Field(
        False, description="For sweeps: stop at the first failed task instead of running the rest."
    )
    omp_num_threads: StrictInt | None = Field(
        None, ge=1, description="OMP_NUM_THREADS per process. Default: resources.cpus / processes per node when "
        "resources.cpus is set (what a node may use, even beyond this machine's cores: render then notes the "
        "oversubscription), else this machine's cores / all local processes; at least 1.",
    )
    container: Literal["none", "podman", "docker"] = Field(
        "none",
        description="Run each node's torchrun inside the spec's image with this engine, one container per node: "
        "host network and IPC, the working, run and output directories mounted at the same paths, the same "
        "environment, your uid:gid, all GPUs when there are any. none: this machine's Python runs it.",
    )
    network: Literal["host", "bridge"] = Field(
        "host",
        description="With local.container: host: the containers share this machine's network (rendezvous on "
        "127.0.0.1). bridge: a network of the job's own (internal: nothing leaves this machine) gives each "
        "node's container its own address, node 0's being the rendezvous address; NCCL/Gloo use eth0.",
    )


# What this target brings (launcher.core.plugins): named by pyproject.toml's ddpjob.targets entry point.
TARGET = TargetPlugin("launcher.targets.local.target:LocalTarget", LocalOptions, "Options for --target local (torchrun agents on this machine).")
