"""How jobs look on a terminal: ``ddpjob status`` and ``ddpjob list`` as lines of text."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.registry import JobRecord
    from launcher.targets.base import JobStatus


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def status_lines(rec: JobRecord, st: JobStatus | None) -> list[str]:
    """The job, its state and root cause, each run (task) and its nodes."""
    out: list[str] = []
    out.append(f"job:      {rec.id} ({rec.target})")
    out.append(f"state:    {rec.state.value}")
    if rec.message:
        out.append(f"message:  {rec.message}")
    out.append(f"run dir:  {rec.run_dir}")
    out.append(f"created:  {when(rec.created_at)}" + (f"   ended: {when(rec.ended_at)}" if rec.ended_at else ""))
    if st is not None:
        for key, value in sorted(st.details.items()):
            if key != "run_dir" and value not in (None, "", [], {}):
                out.append(f"{key + ':':<9} {value}")
        for t in st.tasks:
            params = " ".join(f"{k}={v}" for k, v in t.params.items())
            head = f"task {t.index}" + (f" [{t.native_id}]" if t.native_id else "")
            out.append(f"  {head}: {t.state.value}" + (f" ({params})" if params else "") + (f": {t.message}" if t.message else ""))
            for n in t.nodes:
                extra = " ".join(f"{k}={v}" for k, v in n.items() if k not in ("node", "log", "ended"))
                out.append(f"    node {n.get('node', '?')}: {extra}")
    return out


def job_table(records: list[JobRecord]) -> list[str]:
    """One row per job, columns aligned; the message (cut to 60 characters) last."""
    rows = [("ID", "TARGET", "STATE", "NODES", "CREATED", "MESSAGE")]
    for r in records:
        rows.append((r.id, r.target, r.state.value, str(r.spec.get("nodes", "")), when(r.created_at), r.message[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[5] for row in rows]
