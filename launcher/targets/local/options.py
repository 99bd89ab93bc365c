"""The ``local:`` section of a job spec (options used only by the local target)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class LocalOptions(BaseModel):
    """Options for ``--target local`` (torchrun agents on this machine, one per simulated node)."""

    model_config = ConfigDict(extra="forbid")

    stop_on_failure: bool = Field(
        False, description="For sweeps: stop at the first failed element instead of running the rest."
    )
    omp_num_threads: StrictInt | None = Field(
        None, ge=1, description="OMP_NUM_THREADS per process. Default: this machine's cores / all local processes."
    )
