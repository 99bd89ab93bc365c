"""What ``ddpjob list`` prints, once or with ``--watch`` (kubectl's ``get -w``, ``watch``): the queue
taken from the service, as the text table (``-o wide``: more columns), JSON or YAML. Imports only click
at start-up."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

from launcher.cli.formats import MACHINE

if TYPE_CHECKING:
    from launcher.core.progress import Progress
    from launcher.core.states import JobState
    from launcher.service.jobs import Jobs
    from launcher.service.queue import Entry

# For tests only: --watch stops by itself after this many refreshes (the first print not counted),
# as if Ctrl-C had been pressed, so a test needs neither a signal nor a timeout to end it.
ROUNDS_ENV = "DDPJOB_WATCH_ROUNDS"
CLEAR = "\x1b[H\x1b[2J"  # the screen redrawn in place, as watch and top do
# Left out when --watch compares a job's record with the one printed last: they move with the clock.
CLOCK_FIELDS = frozenset({"age_s", "duration_s"})


@dataclass(frozen=True)
class Query:
    """What ``list`` was asked for: ``output`` text, wide, json or yaml; ``headers``: the header line."""

    output: str
    limit: int
    states: list[JobState]
    target: str | None
    name: str | None
    disk: bool = False
    headers: bool = True

    @property
    def filtered(self) -> bool:
        return bool(self.states or self.target or self.name)


@dataclass(frozen=True)
class Snapshot:
    """The queue at one moment: its jobs, the progress of unfinished ones, each job's native ids
    (wide, json, yaml) and whether the limit left jobs out."""

    entries: list[Entry]
    progress: dict[str, Progress | None]
    native: dict[str, list[str]]
    more: bool


def take(service: Jobs, q: Query) -> Snapshot:
    """The queue as ``q`` asks for it, unfinished jobs' states refreshed (``launcher.service.queue``)."""
    from launcher.core.fields import COUNT_MAX
    from launcher.service.queue import queue

    # One more than shown: whether the limit left jobs out, said under the table (not silently cut).
    entries = queue(service.registry, limit=min(q.limit + 1, COUNT_MAX) if q.limit else None, target=q.target,
                    states=q.states, name=q.name)
    more = bool(q.limit) and len(entries) > q.limit
    entries = entries[:q.limit] if q.limit else entries
    progress = {e.rec.id: service.progress(e.rec) for e in entries if not e.rec.state.terminal}
    native = {e.rec.id: service.native_ids(e.rec) for e in entries} if q.output != "text" else {}
    return Snapshot(entries, progress, native, more)


def record(snap: Snapshot, e: Entry) -> dict[str, object]:
    """A job's compact record (``list -o json``)."""
    from launcher.cli.show import job_summary

    return job_summary(e.rec, snap.progress.get(e.rec.id), snap.native.get(e.rec.id, []), e)


def print_once(service: Jobs, q: Query, *, colour: bool) -> None:
    """``ddpjob list`` without ``--watch``."""
    from launcher.cli.formats import echo
    from launcher.cli.show import job_table

    snap = take(service, q)
    if q.output in MACHINE:  # compact: the whole spec and handle stay in status -o json
        echo([record(snap, e) for e in snap.entries], q.output, sort_keys=True)
        return
    if not snap.entries:
        _nothing(q)
        return
    for line in job_table(snap.entries, snap.progress, disk=q.disk, colour=colour, native=snap.native,
                          wide=q.output == "wide", headers=q.headers):
        click.echo(line)
    _more(q, snap)


def _nothing(q: Query, *, err: bool = False) -> None:
    # Without headers the output is a script's input: the words go to stderr, stdout stays empty.
    click.echo("no job matches" if q.filtered else "no jobs yet; write an example spec with `ddpjob init`, then: "
               "ddpjob submit quickstart.yaml --target local --nodes 2", err=err or not q.headers)


def _more(q: Query, snap: Snapshot) -> None:
    if snap.more:
        click.echo(f"(the newest {q.limit} jobs; there are more: --limit N shows N, --limit 0 all)", err=True)


def _pause(seconds: float) -> None:
    time.sleep(seconds)  # (its own function: a test replaces it to change jobs between two refreshes)


def watch(service: Jobs, q: Query, interval: float, *, colour: bool) -> None:
    """``ddpjob list --watch``: the table, then every ``interval`` seconds again until Ctrl-C (exit
    0, as watch and kubectl get -w). Text on a terminal is redrawn in place; otherwise (a pipe, a log,
    and json or yaml anywhere) each job is printed when first seen and then only when it changed: a
    line of the table, a JSON line or a YAML document. Age and duration alone are no change."""
    from launcher.cli.support import interrupted
    from launcher.core.errors import DdpjobError

    rounds = _rounds()
    screen = q.output not in MACHINE and sys.stdout.isatty()
    changes = Changes(q, colour=colour)
    done = 0
    try:
        while True:
            snap = take(service, q)
            if screen:
                _redraw(q, snap, interval, colour)
            else:
                changes.show(service, snap)
            if (rounds is not None and done >= rounds) or _reader_gone():
                return
            done += 1
            _pause(interval)
    except KeyboardInterrupt:
        return
    except DdpjobError as e:  # a Ctrl-C inside the registry or a scheduler's query is one too
        if interrupted(e):
            return
        raise


def _reader_gone() -> bool:
    """Whether the reader of a pipe has left (``ddpjob list -w | head -3``): without this a watch
    whose jobs do not change would never write again, and so never learn it."""
    from launcher.cli.support import stdout_gone

    try:
        sys.stdout.fileno()
    except (OSError, ValueError):
        return False  # not a file (a test's runner): no reader to lose
    return stdout_gone()


def _rounds() -> int | None:
    try:
        return max(0, int(os.environ[ROUNDS_ENV]))
    except (KeyError, ValueError):
        return None


def _redraw(q: Query, snap: Snapshot, interval: float, colour: bool) -> None:
    from launcher.cli.show import job_table

    click.echo(CLEAR, nl=False)
    if q.headers:
        click.echo(f"every {interval:g}s: ddpjob list, at {time.strftime('%H:%M:%S')} (Ctrl-C stops)\n")
    if not snap.entries:
        _nothing(q)
    for line in job_table(snap.entries, snap.progress, disk=q.disk, colour=colour, native=snap.native,
                          wide=q.output == "wide", headers=q.headers):
        click.echo(line)
    _more(q, snap)


@dataclass
class Changes:
    """What ``--watch`` printed of each job listed (its state, and its row or record less the clock
    columns), to print only what changed. It holds the jobs of the last listing only: a job that left
    it in another state (it ended while --state running was asked) is printed once more, then forgotten."""

    q: Query
    colour: bool = False
    shown: dict[str, tuple[str, object]] = field(default_factory=dict)
    rounds: int = 0
    header_done: bool = False

    def show(self, service: Jobs, snap: Snapshot) -> None:
        departed = self._departed(service, snap)
        if departed:
            snap = Snapshot(snap.entries + departed,
                            {**snap.progress, **{e.rec.id: service.progress(e.rec) for e in departed
                                                 if not e.rec.state.terminal}},
                            {**snap.native, **({e.rec.id: service.native_ids(e.rec) for e in departed}
                                               if self.q.output != "text" else {})}, snap.more)
        if self.rounds == 0:
            if not snap.entries:
                _nothing(self.q, err=True)  # (the stream itself stays rows or records only)
            _more(self.q, snap)
        if self.q.output in MACHINE:
            self._records(snap)
        else:
            self._lines(snap)
        listed = {e.rec.id for e in snap.entries} - {e.rec.id for e in departed}
        self.shown = {k: v for k, v in self.shown.items() if k in listed}
        self.rounds += 1

    def _records(self, snap: Snapshot) -> None:
        import json

        from launcher.cli.formats import yaml_text

        for e in snap.entries:
            data = record(snap, e)
            if self._changed(e, {k: v for k, v in data.items() if k not in CLOCK_FIELDS}):
                line = json.dumps(data, sort_keys=True)
                click.echo(line if self.q.output == "json" else yaml_text(json.loads(line), explicit_start=True))

    def _lines(self, snap: Snapshot) -> None:
        from launcher.cli.show import CLOCK_COLUMNS, aligned, job_rows

        rows = job_rows(snap.entries, snap.progress, disk=self.q.disk, native=snap.native,
                        wide=self.q.output == "wide")
        lines = aligned(rows, colour=self.colour)
        kept = [i for i, name in enumerate(rows[0]) if name not in CLOCK_COLUMNS]
        for e, row, line in zip(snap.entries, rows[1:], lines[1:]):
            if self._changed(e, tuple(row[i] for i in kept)):
                if self.q.headers and not self.header_done:
                    click.echo(lines[0])
                    self.header_done = True
                click.echo(line)

    def _changed(self, e: Entry, now: object) -> bool:
        before = self.shown.get(e.rec.id)
        self.shown[e.rec.id] = (e.rec.state.value, now)
        return before != self.shown[e.rec.id]

    def _departed(self, service: Jobs, snap: Snapshot) -> list[Entry]:
        """The jobs printed before that this listing lacks and whose state has changed since (a job
        that only fell past --limit, or was removed, is not printed again)."""
        from launcher.core.errors import JobNotFound
        from launcher.service.queue import Entry

        listed = {e.rec.id for e in snap.entries}
        out = []
        for job_id, (state, _) in self.shown.items():
            if job_id in listed:
                continue
            try:
                rec = service.registry.get(job_id)
            except JobNotFound:
                continue
            if rec.id == job_id and rec.state.value != state:  # (get takes a prefix: never another job's)
                out.append(Entry(rec))
        return out
