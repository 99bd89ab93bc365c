"""Submitting a loaded spec and following it to its end: shared by ``submit`` and ``rerun``.

Ctrl-C while the job is handed over is held until its id is printed; Ctrl-C while following says
that the job runs on, how to follow it again and how to cancel it. Imports only click at start-up.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from launcher.core.states import JobState

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs, Submission
    from launcher.spec.load import LoadedSpec


def after_ctrl_c(job_id: str, *, doing: str, again: tuple[str, str] | None = None) -> str:
    """The words after a Ctrl-C that left ``job_id`` running: how to see it again and to stop it;
    ``again``: (label, command) to go back to what was stopped, e.g. ("wait", "ddpjob wait ID")."""
    more = f"  {again[0] + ':':<8} {again[1]}\n" if again else ""
    return (f"\nCtrl-C: {doing}; {job_id} keeps running.\n{more}"
            f"  follow:  ddpjob logs {job_id} -f\n"
            f"  status:  ddpjob status {job_id}\n"
            f"  cancel:  ddpjob cancel {job_id}")


def submit_and_report(service: Jobs, loaded: LoadedSpec, target: str, *, follow: bool, quiet: bool,
                      preflight: bool) -> None:
    """Submit, print the id (and, with ``follow``, stream the logs to the end), then exit as
    ``submit`` does: 0, the job's result with ``follow``, 130 after a Ctrl-C."""
    from launcher.core.interrupts import deferred_interrupt
    from launcher.service.jobs import SubmitInterrupted

    # Ctrl-C from here on waits until the job is recorded and its id printed (at most the target's
    # own timeouts): a job is never submitted without the user learning its id.
    with deferred_interrupt() as held:
        try:
            done = service.submit(loaded, target, preflight=preflight)
        except SubmitInterrupted as e:
            done = e.submission
            held.append(signal.SIGINT)
        print_submitted(done, target, quiet=quiet, hints=not follow and not held)
    if held:
        click.echo(after_ctrl_c(done.job_id, doing="it was submitted"), err=True)
        sys.exit(130)
    if follow:
        sys.exit(follow_to_end(service, done.job_id))


def print_submitted(done: Submission, target: str, *, quiet: bool, hints: bool) -> None:
    job_id, plan = done.job_id, done.plan
    if quiet:
        click.echo(job_id)
        sys.stdout.flush()
        return
    click.echo(f"Submitted {job_id} to {target}: {plan.shape()}")
    click.echo(f"  run dir: {plan.run_dir}")
    job_dir = done.handle.log_dir()
    if job_dir:
        click.echo(f"  job dir: {job_dir}  (scripts, node logs and outputs on the cluster)")
    if hints:
        click.echo(f"  follow:  ddpjob logs {job_id} -f")
        click.echo(f"  status:  ddpjob status {job_id}")
    sys.stdout.flush()


def follow_to_end(service: Jobs, job_id: str, flt: Any = None) -> int:
    """Stream the job's lines until it ends; 0 if it SUCCEEDED, 1 otherwise, 130 on Ctrl-C."""
    from launcher.cli import colour
    from launcher.core.progress import describe
    from launcher.targets.base import LogFilter

    live = sys.stderr.isatty() and sys.stdout.isatty()  # progress between the lines, on a terminal only
    coloured = colour.enabled(sys.stdout)
    shown = time.monotonic()
    try:
        for line in service.logs(job_id, flt or LogFilter(), follow=True):
            click.echo(colour.line(line, coloured))
            if live and time.monotonic() - shown > 15:
                shown = time.monotonic()
                progress = describe(service.progress(service.get(job_id)))
                if progress:
                    click.echo(f"[ddpjob] {job_id}: {progress}", err=True)
        rec, _ = service.refresh(job_id)
    except KeyboardInterrupt:
        click.echo(after_ctrl_c(job_id, doing="stopped following"), err=True)
        return 130
    shown_state = colour.state(rec.state.value, rec.state.value, colour.enabled(sys.stderr))
    click.echo(f"{rec.id}: {shown_state}" + (f": {rec.message}" if rec.message else ""), err=True)
    return 0 if rec.state is JobState.SUCCEEDED else 1
