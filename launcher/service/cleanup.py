"""Removing finished jobs: ``ddpjob rm`` and ``ddpjob prune``, and how much disk a job uses.

Only what ddpjob made under ``$DDPJOB_HOME`` is deleted: the job's record and its run directory
(logs, plans and, by default on the local target, the outputs). Folders elsewhere (a Slurm job
folder, an ``output_dir`` you chose) may hold results you want: they are listed, never deleted.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import DdpjobError, UsageError
from launcher.core.states import TERMINAL, JobState

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs
    from launcher.service.registry import JobRecord

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class Removed:
    """One job removed: its id, the bytes freed and folders outside $DDPJOB_HOME left in place."""

    job_id: str
    freed: int = 0
    kept: list[str] = field(default_factory=list)


def parse_duration(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` or a number of seconds -> seconds."""
    m = _DURATION.match(text.strip())
    if not m:
        raise UsageError(f"--older-than {text!r}: give a duration such as 7d, 12h, 30m or 90s")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def disk_use(path: str) -> int:
    """Bytes under ``path`` (0 when it is gone); symbolic links are not followed."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def remove(jobs: Jobs, job_id: str, *, force: bool = False) -> Removed:
    """Forget a finished job and delete its run directory. ``force`` cancels a live job first."""
    rec = jobs.get(job_id)
    if not rec.state.terminal:
        # The record says what was last seen (PENDING until someone asked): ask the target now, so
        # the refusal names the job's real state and a job that has ended since is removed.
        try:
            rec, _ = jobs.refresh(rec.id)
        except DdpjobError:  # the target is out of reach: the recorded state is all there is
            pass
    if not rec.state.terminal:
        if not force:
            raise UsageError(f"{rec.id} is {rec.state.value}: cancel it first, or use rm --force")
        jobs.cancel(rec.id)
        rec = jobs.get(rec.id)
    runs = jobs.registry.runs_dir().resolve()
    run_dir = Path(rec.run_dir)
    done = Removed(rec.id)
    if run_dir.resolve().parent == runs:  # never delete outside $DDPJOB_HOME/runs
        done.freed = disk_use(str(run_dir))
        shutil.rmtree(run_dir, ignore_errors=True)
    done.kept = [p for p in _folders_elsewhere(rec) if os.path.exists(p)]
    jobs.registry.delete(rec.id)
    return done


def prune(jobs: Jobs, *, older_than_s: float, states: set[JobState] | None = None,
          dry_run: bool = False) -> list[Removed]:
    """Remove finished jobs that ended more than ``older_than_s`` seconds ago (in ``states``)."""
    wanted = set(states or TERMINAL)
    bad = wanted - TERMINAL
    if bad:
        raise UsageError(f"--state {', '.join(s.value for s in bad)}: only finished jobs can be pruned "
                         f"({', '.join(sorted(s.value for s in TERMINAL))})")
    cutoff = time.time() - older_than_s
    out = []
    for rec in jobs.registry.list():
        ended = rec.ended_at or rec.updated_at
        if rec.state in wanted and ended <= cutoff:
            out.append(Removed(rec.id, disk_use(rec.run_dir)) if dry_run else remove(jobs, rec.id))
    return out


def _folders_elsewhere(rec: JobRecord) -> list[str]:
    """Folders of the job outside $DDPJOB_HOME/runs: a Slurm job folder, a chosen output_dir."""
    out = []
    if rec.job_dir:
        out.append(rec.job_dir)
    output_dir = rec.summary.output_dir
    if output_dir and os.path.isabs(output_dir) and "{" not in output_dir:
        out.append(output_dir)
    return out
