"""The spec's ``notify:`` section: a command to run and/or a URL to POST to once the job ends.

Delivered by a small watcher that ``submit`` leaves running on the submitting machine
(``launcher.service.notifier``), so it arrives also after the shell that submitted is gone. Kept
apart from ``model.py`` so that module stays small.
"""

from __future__ import annotations

from typing import Literal

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
            problem = url_problem(v)
            if problem:
                raise ValueError(problem)
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



def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be POSTed to, in words that never repeat its path (a webhook's secret);
    None when it can. Checked when the spec is loaded, so the watcher never meets a URL it cannot
    send to."""
    from urllib.parse import urlsplit

    bad = next((i for i, c in enumerate(url) if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        what = "a space" if url[bad] == " " else "a control character" if not url[bad].isspace() else "white space"
        return (f"holds {what} (character {bad + 1}): write it URL-encoded (a space as %20), and without "
                "spaces around the URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as e:  # "Invalid IPv6 URL", "Port out of range 0-65535": no part of the URL in it
        return f"is not a valid URL ({e}), e.g. https://hooks.example.com/T0/abc"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. https://hooks.example.com/T0/abc"
    return None
