"""The spec's ``recovery:`` section: what happens to a run when one of its nodes is lost for good.

Read by the targets that bring a run back: local (the supervisor starts the run's nodes again, a new
process in the lost node's place), Slurm (the first node's runner drops a node not heard from for
``lost_after`` seconds from the allocation and starts the run again on the nodes left, as long as
``min_nodes`` remain; a lost first node's place is taken by the next) and Kubernetes (the pods' runners start the run again with a pod the operator
recreated, or without one not heard from for ``lost_after``). The program resumes from its checkpoint. Kept apart from ``model.py``, as
``stall.py`` is.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from launcher.core.errors import Issue

DEFAULT_MAX_LOSSES = 10
DEFAULT_LOST_AFTER_S = 30


class RecoveryOptions(BaseModel):
    """A node is *lost* when a process of ddpjob's own for it (the local node wrapper, or its torchrun
    agent) is killed from outside the job: the machine or the OOM killer took it, or a user did; on
    Slurm, when its node runner is not heard from for ``lost_after`` seconds (its machine, its slurmd
    or its link gone); on Kubernetes, when its pod is recreated (deleted, evicted, its node lost) or
    not heard from for ``lost_after``. The run is then brought back by itself: locally every node of it
    is started again, the lost one replaced; on Slurm the lost node leaves the allocation and the run
    starts again on the nodes left (the first node too: the lowest other node takes its place when the
    nodes it hears are more than half the run, and a first node that hears half or less leaves, so a
    split run goes on on one side only); on Kubernetes with the recreated pod, or without a silent one. The program resumes from its newest checkpoint (the reference trainer does by
    itself; a program of your own reads ``DDPJOB_RESTART_COUNT`` and its checkpoint in
    ``DDPJOB_OUTPUT_DIR``). A worker that fails on its own is the program's failure, not a lost node:
    ``max_restarts`` is for that."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    max_losses: StrictInt = Field(
        DEFAULT_MAX_LOSSES, ge=0, le=1000,
        description="How many lost nodes a run survives (each brought back within seconds on the local "
        "target, its work since its last checkpoint redone); one more ends it FAILED saying so. 0: a "
        "lost node ends the run, as ddpjob did before. Default: 10.",
    )
    min_nodes: StrictInt = Field(
        1, ge=1, le=100_000,
        description="Slurm and Kubernetes: the fewest nodes a run goes on with after losing some (on Slurm each "
        "lost node leaves the allocation; the program sees the smaller world size and, with the reference "
        "trainer, keeps its place in the data and its learning-rate schedule). Fewer left ends the run FAILED "
        "saying so. Default: 1. (The local target replaces a lost node instead, and so does Kubernetes when the "
        "operator recreates the pod within lost_after.)",
    )
    lost_after: StrictInt = Field(
        DEFAULT_LOST_AFTER_S, ge=10, le=3600,
        description="Slurm and Kubernetes: seconds without a heartbeat from a node (one every 2 s) after which "
        "it is lost and the run goes on without it. Set it below stall.timeout: the stall watch only reports (or "
        "ends the run) at its timeout. Default: 30.",
    )


def recovery_issues(nodes: int, recovery: RecoveryOptions) -> list[Issue]:
    """What the section asks that the job's size cannot give."""
    if recovery.min_nodes > nodes:
        return [Issue(("recovery", "min_nodes"), f"is {recovery.min_nodes}, more than the job's {nodes} node(s)",
                      hint=f"set it to at most {nodes}: the fewest nodes the run goes on with after losing some")]
    return []
