"""The spec's ``recovery:`` section: what happens to a run when one of its nodes is lost for good.

Read by the targets that bring a run back (local today: the supervisor starts the run's nodes again, a
new process in the lost node's place, and the program resumes from its checkpoint). Kept apart from
``model.py``, as ``stall.py`` is.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

DEFAULT_MAX_LOSSES = 10


class RecoveryOptions(BaseModel):
    """A node is *lost* when a process of ddpjob's own for it (the local node wrapper, or its torchrun
    agent) is killed from outside the job: the machine or the OOM killer took it, or a user did. The
    run is then brought back by itself: every node of it is started again, the lost one replaced, and
    the program resumes from its newest checkpoint (the reference trainer does by itself; a program
    of your own reads ``DDPJOB_RESTART_COUNT`` and its checkpoint in ``DDPJOB_OUTPUT_DIR``). A worker
    that fails on its own is the program's failure, not a lost node: ``max_restarts`` is for that."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    max_losses: StrictInt = Field(
        DEFAULT_MAX_LOSSES, ge=0, le=1000,
        description="How many lost nodes a run survives (each brought back within seconds on the local "
        "target, its work since its last checkpoint redone); one more ends it FAILED saying so. 0: a "
        "lost node ends the run, as ddpjob did before. Default: 10.",
    )
