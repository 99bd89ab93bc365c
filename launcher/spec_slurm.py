"""The ``slurm:`` section of a job spec (options used only by the Slurm target)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SlurmOptions(BaseModel):
    """Options for ``--target slurm``. Validated as part of every spec; used only by that target."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = Field(None, description="Slurm partition (sbatch --partition).")
