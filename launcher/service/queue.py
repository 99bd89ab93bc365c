"""The queue view: jobs newest first, filtered, unfinished ones refreshed with one batched query per
target, and what ``ddpjob list`` shows of each (age, duration, a sweep's runs done)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core.errors import DdpjobError
from launcher.core.states import TERMINAL, JobState
from launcher.service.shape import check_count

if TYPE_CHECKING:
    from launcher.service.registry import JobRecord, Registry
    from launcher.targets.jobstatus import JobStatus

_LIVE = frozenset(JobState) - TERMINAL


@dataclass
class Entry:
    """A job of the queue; ``status``: what its target said now (unfinished jobs only)."""

    rec: JobRecord
    status: JobStatus | None = None

    def runs(self) -> tuple[int | None, int]:
        """(runs ended, runs in all): ended is None when not known (a running job its target did not say
        of). Every run of a job that has ended has ended too (a run it never started ended with it)."""
        total = (self.rec.shape.runs if self.rec.shape else None) or 1
        if self.rec.state.terminal:
            return total, total
        tasks = self.status.tasks if self.status is not None else []
        if not tasks:
            return None, total
        return sum(1 for t in tasks if t.state.terminal), max(total, len(tasks))

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the job was submitted."""
        return max(0.0, (now or time.time()) - self.rec.created_at)

    def duration_s(self, now: float | None = None) -> float:
        """Seconds from its start to its end as its target records them (``JobRecord.duration_s``)."""
        return self.rec.duration_s(now)


def queue(registry: Registry, *, limit: int | None = 50, target: str | None = None, states: Iterable[JobState] = (),
          name: str | None = None) -> list[Entry]:
    """Jobs of ``registry`` newest first, at most ``limit`` (None or 0: all), of ``target``, in
    ``states`` (as they are now: recorded states of unfinished jobs are refreshed first), named like
    the glob ``name``. A target out of reach leaves its jobs as last known, their message saying so."""
    from launcher.targets.lookup import get_target

    check_count("--limit", limit)
    wanted = frozenset(states)
    # An unfinished job may have ended since it was recorded: ask for those too, then filter.
    asked = wanted | _LIVE if wanted & TERMINAL else wanted
    records = registry.list(limit=None if wanted else (limit or None), target=target, states=asked, name=name)
    live: dict[str, dict[str, dict[str, object]]] = {}
    for rec in records:
        if not rec.state.terminal and rec.handle is not None:
            live.setdefault(rec.target, {})[rec.id] = rec.handle
    stale: dict[str, str] = {}
    fresh: dict[str, JobStatus] = {}
    for tname, handles in live.items():
        try:
            tgt = get_target(tname)
            fresh.update(tgt.status_many(handles))
        except DdpjobError as e:
            stale[tname] = str(e)
    out = []
    for r in records:
        if r.target in stale and r.id in live[r.target]:
            # Last known, not current: say so instead of passing an old state off as news.
            r = dataclasses.replace(r, message=f"(stale: last known state; {stale[r.target]})"
                                    + (f" {r.message}" if r.message else ""))
        elif r.id in fresh:
            fresh[r.id] = fresh[r.id].scrubbed(r.scrub)  # as Jobs.refresh: the job's secrets never shown
            started, ended = fresh[r.id].span()
            r = registry.note_state(r, fresh[r.id].state, fresh[r.id].message, started=started, ended=ended)
        if not wanted or r.state in wanted:
            out.append(Entry(r, fresh.get(r.id)))
    return out[:limit] if limit else out
