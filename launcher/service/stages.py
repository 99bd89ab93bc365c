"""One line for a live display: where a job is on its way to its first step (waiting in Slurm's
queue, pods pending, nodes starting, rendezvous, workers running), then its progress."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs
    from launcher.service.registry import JobRecord


def live_line(jobs: Jobs, job_id: str) -> tuple[JobRecord, str]:
    """The job's record (refreshed from its target) and its line: ``RUNNING: 1/2 node(s)
    started; ...`` before the first step, ``RUNNING, step 10/300, loss ...`` after it."""
    from launcher.core.progress import describe, with_health

    rec, st = jobs.refresh(job_id)
    if rec.state.terminal or st is None:
        return rec, rec.state.value + (f": {st.message}" if st is not None and st.message else "")
    progress = jobs.progress(rec)
    if progress:
        return rec, f"{rec.state.value}, {with_health(describe(progress), st.message)}"
    return rec, f"{rec.state.value}: {jobs.bound(rec).stage(st)}"
