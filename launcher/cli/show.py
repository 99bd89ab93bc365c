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
    from launcher.core.progress import advice, describe, duration

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
    # Started and ended as the target records them (``JobRecord.duration_s``): what list and results say too.
    out.append(f"created:  {when(rec.created_at)}" + (f"   started: {when(rec.started_at)}" if rec.started_at else "")
               + (f"   ended: {when(rec.ended_at)}   duration: {duration(rec.duration_s(), tenths_below=60)}"
                  if rec.ended_at else ""))
    if rec.summary.notify:
        from launcher.service import notifier

        notify = notifier.state_of(rec)
        out.append(f"notify:   {notifier.describe(notify) if notify else '-'}")
    if st is not None:
        for key, value in sorted(st.shown_details().items()):
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


# Columns that move with the clock alone (and the disk a running job fills): ``list --watch`` does not
# call a job changed for them.
CLOCK_COLUMNS = frozenset({"AGE", "DURATION", "SIZE"})


def job_rows(entries: list[Entry], progress: dict[str, Progress | None] | None = None, *, disk: bool = False,
             native: dict[str, list[str]] | None = None, wide: bool = False) -> list[tuple[str, ...]]:
    """The header, then one row per job, the message last: age (since submit) and duration (its start
    to its end, or to now while it runs, as its target records them: ``JobRecord.duration_s``); a
    sweep's runs ended (``runs 2/4``) and the message (or a running job's progress), cut to 60.
    ``wide`` (``-o wide``): also the processes per node, the runs (ended/all), the scheduler's own ids
    (``native``: Slurm job id, Kubernetes object names) and the run directory; an empty cell is ``-``
    there, so that every row has as many words before the message."""
    from launcher.core.progress import describe, duration, with_health
    from launcher.service.cleanup import disk_use

    now = time.time()
    head = ("ID", "TARGET", "STATE", "NODES") + (("PROCS", "RUNS") if wide else ()) + ("AGE", "DURATION") \
        + (("SIZE",) if disk else ()) + (("NATIVE ID", "RUN DIR") if wide else ())
    rows = [(*head, "MESSAGE")]
    for e in entries:
        r = e.rec
        note = with_health(describe((progress or {}).get(r.id)), r.message) or r.message
        done, total = e.runs()
        runs = f"{done if done is not None else '?'}/{total}"
        if total > 1 and not wide:
            note = f"runs {runs}" + (f"; {note}" if note else "")
        size = (size_text(disk_use(r.run_dir)),) if disk else ()
        shape = ((_text(r.shape.procs_per_node if r.shape else None) or "-", runs) if wide else ())
        where = ((_ids((native or {}).get(r.id, [])), r.run_dir or "-") if wide else ())
        rows.append((r.id, r.target, r.state.value, _text(r.summary.nodes) or ("-" if wide else ""), *shape,
                     duration(e.age_s(now)), duration(e.duration_s(now)), *size, *where, note[:60]))
    return rows


def job_table(entries: list[Entry], progress: dict[str, Progress | None] | None = None, *,
              disk: bool = False, colour: bool = False, native: dict[str, list[str]] | None = None,
              wide: bool = False, headers: bool = True) -> list[str]:
    """``job_rows`` as lines, columns aligned (the header's widths count even when ``headers`` is
    False, so a row looks the same with and without it); ``colour``: the state column in colour (on a
    terminal)."""
    lines = aligned(job_rows(entries, progress, disk=disk, native=native, wide=wide), colour=colour)
    return lines if headers else lines[1:]


def aligned(rows: list[tuple[str, ...]], *, colour: bool = False) -> list[str]:
    """The header and rows of ``job_rows`` as lines: every column padded but the last (the message)."""
    from launcher.cli.colour import state as painted

    n = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(n)]
    state_at = rows[0].index("STATE")
    return ["  ".join(painted(c.ljust(w), c, colour and k > 0 and i == state_at)
                      for i, (c, w) in enumerate(zip(row, widths))) + "  " + row[n] for k, row in enumerate(rows)]


def _ids(ids: list[str]) -> str:
    """The native ids of ``-o wide``, one word: ``4242``, ``job-0,job-1``; a sweep of many Kubernetes
    objects shows its first three and how many more (``list -o json`` has them all)."""
    if not ids:
        return "-"
    return ",".join(ids[:3]) + (f",+{len(ids) - 3}" if len(ids) > 3 else "")


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
        "started": datetime.fromtimestamp(rec.started_at, timezone.utc).isoformat(timespec="seconds") if rec.started_at else None,
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
