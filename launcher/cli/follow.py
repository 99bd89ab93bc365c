"""Submitting a loaded spec and following it to its end: shared by ``submit`` and ``rerun``; and
``wait``'s live line.

Ctrl-C while the job is handed over is held until its id is printed; Ctrl-C while following says
that the job runs on, how to follow it again and how to cancel it. On a terminal, the stages a
starting job passes (queue, nodes starting, rendezvous, workers running) are shown with the time
since the command began; nothing extra when the output is piped. Imports only click at start-up.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

import click

from launcher.core.states import JobState

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.service.jobs import Jobs, Submission
    from launcher.service.registry import JobRecord
    from launcher.spec.load import LoadedSpec
    from launcher.targets.base import LogFilter


CLEAR = "\r\033[K"


def elapsed(start: float) -> str:
    from launcher.core.progress import duration

    return duration(time.monotonic() - start)


class StageLine:
    """A line on stderr, rewritten in place every second until the job's first log line: the
    elapsed time and where the job is (``service.stages.live_line``, asked every 2 s)."""

    def __init__(self, service: Jobs, job_id: str) -> None:
        self.service, self.job_id = service, job_id
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.text = "submitted"
        self.shown = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def stop(self) -> None:
        """No more stage lines (the job's own lines have begun, or it ended); the line is cleared."""
        with self.lock:
            if not self.done.is_set():
                self.done.set()
                if self.shown:
                    click.echo(CLEAR, err=True, nl=False)

    def _run(self) -> None:
        from launcher.service.stages import live_line

        asked = 0.0
        while not self.done.wait(0 if not self.shown else 1.0):
            if time.monotonic() - asked >= 2.0:
                asked = time.monotonic()
                with contextlib.suppress(Exception):  # a display only: the follow itself reports errors
                    self.text = live_line(self.service, self.job_id)[1]
            with self.lock:
                if self.done.is_set():
                    return
                click.echo(f"{CLEAR}[ddpjob] {elapsed(self.start)}: {self.text}"[:220], err=True, nl=False)
                self.shown = True


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
    for notice in done.notices:  # what the build left out of the image: said even with -q (stdout keeps the id)
        click.echo(notice, err=True)
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


def follow_to_end(service: Jobs, job_id: str, flt: LogFilter | None = None) -> int:
    """Stream the job's lines until it ends; 0 if it SUCCEEDED, 1 otherwise, 130 on Ctrl-C."""
    from launcher.cli import colour
    from launcher.core.progress import describe, with_health
    from launcher.targets.base import LogFilter

    live = sys.stderr.isatty() and sys.stdout.isatty()  # stages and progress on a terminal only
    coloured = colour.enabled(sys.stdout)
    shown = time.monotonic()
    stages = StageLine(service, job_id) if live else None
    try:
        if stages is not None:
            stages.thread.start()
        for line in service.logs(job_id, flt or LogFilter(), follow=True):
            if stages is not None:
                stages.stop()
            click.echo(colour.line(line, coloured))
            if live and time.monotonic() - shown > 15:
                shown = time.monotonic()
                rec, _ = service.refresh(job_id)  # its message says what the stall watch sees
                progress = with_health(describe(service.progress(rec)), rec.message)
                if progress:
                    click.echo(f"[ddpjob] {job_id}: {progress}", err=True)
        rec, _ = service.refresh(job_id)
    except KeyboardInterrupt:
        if stages is not None:
            stages.stop()
        click.echo(after_ctrl_c(job_id, doing="stopped following"), err=True)
        return 130
    finally:
        if stages is not None:
            stages.stop()
    shown_state = colour.state(rec.state.value, rec.state.value, colour.enabled(sys.stderr))
    click.echo(f"{rec.id}: {shown_state}" + (f": {rec.message}" if rec.message else ""), err=True)
    if rec.state is JobState.FAILED and not (flt and flt.verbose):
        click.echo(f"  (torchrun's own tracebacks were left out: ddpjob logs {rec.id} --verbose)", err=True)
    return 0 if rec.state is JobState.SUCCEEDED else 1


def wait_line(service: Jobs, start: float) -> Callable[[JobRecord], None]:
    """``wait``'s ``on_poll``: the job's line (stages, then progress) rewritten in place."""
    from launcher.service.stages import live_line

    def show(rec: JobRecord) -> None:
        line = f"{rec.id}: " + live_line(service, rec.id)[1]
        click.echo(f"{CLEAR}[{elapsed(start)}] {line}"[:220], err=True, nl=False)

    return show

