"""How jobs look on a terminal: ``ddpjob status`` and ``ddpjob list`` as lines of text."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.core.progress import Progress
    from launcher.service.queue import Entry
    from launcher.service.registry import JobRecord
    from launcher.targets.jobstatus import JobStatus


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def status_lines(rec: JobRecord, st: JobStatus | None, progress: Progress | None = None, *,
                 colour: bool = False) -> list[str]:
    """The job, its state and root cause, its progress, each run (task) and its nodes; ``colour``:
    states in colour (``launcher.cli.colour``, on a terminal)."""
    from launcher.cli.colour import state as painted
    from launcher.core.progress import advice, describe

    out: list[str] = []
    out.append(f"job:      {rec.id} ({rec.target})")
    out.append(f"state:    {painted(rec.state.value, rec.state.value, colour)}")
    if rec.message:
        out.append(f"message:  {rec.message}")
    if progress:
        out.append(f"progress: {describe(progress)}" + (f" (task {progress.task})" if progress.task is not None else ""))
        if hint := advice(progress):
            out.append(f"advice:   {hint}")
    if rerun_of := (rec.origin or {}).get("rerun_of"):
        out.append(f"rerun of: {rerun_of}")
    out.append(f"run dir:  {rec.run_dir}")
    out.append(f"created:  {when(rec.created_at)}" + (f"   ended: {when(rec.ended_at)}" if rec.ended_at else ""))
    if rec.summary.notify:
        from launcher.service import notifier

        notify = notifier.state_of(rec)
        out.append(f"notify:   {notifier.describe(notify) if notify else '-'}")
    if st is not None:
        for key, value in sorted(st.details.items()):
            if key != "run_dir" and value not in (None, "", [], {}):
                out.append(f"{key + ':':<9} {value}")
        for t in st.tasks:
            params = " ".join(f"{k}={v}" for k, v in t.params.items())
            head = f"task {t.index}" + (f" [{t.native_id}]" if t.native_id else "")
            out.append(f"  {head}: {painted(t.state.value, t.state.value, colour)}" + (f" ({params})" if params else "")
                       + (f": {t.message}" if t.message else "") + (f" [{t.losses_note()}]" if t.losses else ""))
            for loss in t.losses:
                out.append(f"    lost:   {loss.line()}")
            for n in t.nodes:
                # A value not known yet (a running node's exit code) is left out, never shown as None.
                extra = " ".join(f"{k}={v}" for k, v in n.details())
                out.append(f"    node {'?' if n.node is None else n.node}: {extra}")
    return out


def job_table(entries: list[Entry], progress: dict[str, Progress | None] | None = None, *,
              disk: bool = False, colour: bool = False) -> list[str]:
    """One row per job, columns aligned: age (since submit) and duration (submit to end, or to now
    while it runs); last, a sweep's runs ended (``runs 2/4``) and the message (or a running job's
    progress), cut to 60. ``colour``: the state column in colour (on a terminal)."""
    from launcher.cli.colour import state as painted
    from launcher.core.progress import describe, duration, with_health
    from launcher.service.cleanup import disk_use

    now = time.time()
    head = ("ID", "TARGET", "STATE", "NODES", "AGE", "DURATION") + (("SIZE",) if disk else ())
    rows = [(*head, "MESSAGE")]
    for e in entries:
        r = e.rec
        note = with_health(describe((progress or {}).get(r.id)), r.message) or r.message
        done, total = e.runs()
        if total > 1:
            note = f"runs {done if done is not None else '?'}/{total}" + (f"; {note}" if note else "")
        size = (size_text(disk_use(r.run_dir)),) if disk else ()
        rows.append((r.id, r.target, r.state.value, _text(r.summary.nodes), duration(e.age_s(now)),
                     duration(e.duration_s(now)), *size, note[:60]))
    n = len(head)
    widths = [max(len(row[i]) for row in rows) for i in range(n)]
    state_at = head.index("STATE")
    return ["  ".join(painted(c.ljust(w), c, colour and k > 0 and i == state_at)
                      for i, (c, w) in enumerate(zip(row, widths))) + "  " + row[n] for k, row in enumerate(rows)]


def job_summary(rec: JobRecord, progress: Progress | None = None, native: list[str] | None = None,
                entry: Entry | None = None) -> dict[str, object]:
    """The compact record of ``list -o json`` (the whole spec is in ``status -o json``); ``native``:
    the scheduler's own ids (``Jobs.native_ids``); ``entry``: the queue's view (age, duration, runs
    ended: None when not known)."""
    shape = rec.shape
    extra = {}
    if entry is not None:
        extra = {"age_s": round(entry.age_s(), 1), "duration_s": round(entry.duration_s(), 1),
                 "runs_done": entry.runs()[0]}
    return {
        "id": rec.id, "name": rec.name, "target": rec.target, "state": rec.state.value,
        "message": rec.message[:500],
        "created": datetime.fromtimestamp(rec.created_at, timezone.utc).isoformat(timespec="seconds"),
        "ended": datetime.fromtimestamp(rec.ended_at, timezone.utc).isoformat(timespec="seconds") if rec.ended_at else None,
        "nodes": shape.nodes if shape and shape.nodes is not None else rec.summary.nodes, "procs_per_node": shape.procs_per_node if shape else None,
        "runs": shape.runs if shape else None, "native_ids": native or [], "progress": progress.to_json() if progress else None,
        "rerun_of": (rec.origin or {}).get("rerun_of"), **extra,
    }


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def size_text(n: int) -> str:
    """Bytes as ``list --du``, ``rm`` and ``prune`` write them: ``512B``, ``10.8K``, ``3.2M``, ``1.5G``."""
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n}"
