"""The spec's ``notify:`` section: a command to run and/or a URL to POST to once the job ends.

Delivered by a small watcher that ``submit`` leaves running on the submitting machine
(``launcher.service.notifier``), so it arrives also after the shell that submitted is gone. Kept
apart from ``model.py`` so that module stays small.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Outcome = Literal["succeeded", "failed", "cancelled"]


class NotifyOptions(BaseModel):
    """What to do once the job ends (every run of a sweep done)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    command: list[str] | None = Field(
        None, min_length=1,
        description="A program to run, as a list (never through a shell), e.g. [notify-send, ddpjob]; its "
        "environment holds DDPJOB_JOB_ID, DDPJOB_JOB_NAME, DDPJOB_TARGET, DDPJOB_STATE, DDPJOB_MESSAGE "
        "(the root cause of a failure) and DDPJOB_RUN_DIR. At most 60 s.",
    )
    url: str | None = Field(
        None,
        description="An http(s) URL that gets a JSON POST: {job_id, name, target, state, message, run_dir}. "
        "Shown as scheme://host/*** (a webhook's path is often its secret).",
    )
    when: list[Outcome] = Field(
        default=["succeeded", "failed", "cancelled"],
        description="The final states that notify (default: every one), e.g. [failed, cancelled]. (Not "
        "`on:`: YAML reads that key as true.)",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            parts = urlsplit(v)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http:// or https:// URL with a host, e.g. https://hooks.example.com/T0/abc")
        return v

    @model_validator(mode="after")
    def _something(self) -> NotifyOptions:
        if self.command is None and self.url is None:
            raise ValueError("give notify.command, notify.url or both (or leave notify out)")
        return self

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v[0].strip():
            raise ValueError("the first word is the program to run: it cannot be empty")
        return v

