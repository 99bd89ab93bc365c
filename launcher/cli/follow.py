"""Following a job to its end (``submit -f``, ``logs -f``) and ``wait``'s live line, on a terminal
with the stages a starting job passes (queue, nodes starting, rendezvous, workers running) and the
time since the command began; nothing extra when the output is piped. Imports only click at
start-up."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from launcher.core.states import JobState

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs
    from launcher.service.registry import JobRecord
    from launcher.targets.base import LogFilter

CLEAR = "\r\033[K"


def elapsed(start: float) -> str:
    s = int(time.monotonic() - start)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


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


def follow_to_end(service: Jobs, job_id: str, flt: LogFilter | None = None) -> int:
    """Print the job's lines until it ends; 0 if it SUCCEEDED, 1 otherwise, 130 on Ctrl-C."""
    from launcher.core.progress import describe
    from launcher.targets.base import LogFilter

    live = sys.stderr.isatty() and sys.stdout.isatty()  # stages and progress on a terminal only
    shown = time.monotonic()
    stages = StageLine(service, job_id) if live else None
    try:
        if stages is not None:
            stages.thread.start()
        for line in service.logs(job_id, flt or LogFilter(), follow=True):
            if stages is not None:
                stages.stop()
            click.echo(line)
            if live and time.monotonic() - shown > 15:
                shown = time.monotonic()
                progress = describe(service.progress(service.get(job_id)))
                if progress:
                    click.echo(f"[ddpjob] {job_id}: {progress}", err=True)
        rec, _ = service.refresh(job_id)
    except KeyboardInterrupt:
        if stages is not None:
            stages.stop()
        click.echo(f"\nStopped following; {job_id} keeps running. Cancel it with: ddpjob cancel {job_id}", err=True)
        return 130
    finally:
        if stages is not None:
            stages.stop()
    click.echo(f"{rec.id}: {rec.state.value}" + (f": {rec.message}" if rec.message else ""), err=True)
    if rec.state is JobState.FAILED and not (flt and flt.verbose):
        click.echo(f"  (torchrun's own tracebacks were left out: ddpjob logs {rec.id} --verbose)", err=True)
    return 0 if rec.state is JobState.SUCCEEDED else 1


def wait_line(service: Jobs, start: float) -> Any:
    """``wait``'s ``on_poll``: the job's line (stages, then progress) rewritten in place."""
    from launcher.service.stages import live_line

    def show(rec: JobRecord) -> None:
        line = f"{rec.id}: " + live_line(service, rec.id)[1]
        click.echo(f"{CLEAR}[{elapsed(start)}] {line}"[:220], err=True, nl=False)

    return show
