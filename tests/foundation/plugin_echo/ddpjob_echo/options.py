"""The ``echo:`` section of a spec, and what the echo target brings to ddpjob."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from launcher.core.plugins import TargetPlugin


class EchoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    greeting: str = Field("hello", description="The first line of the job's log.")


TARGET = TargetPlugin("ddpjob_echo.target:EchoTarget", EchoOptions, "Options for --target echo (one process, here).",
                      "README.md")
