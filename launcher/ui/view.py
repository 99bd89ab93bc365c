"""What the dashboard shows, gathered from the service: the same calls ``ddpjob list``, ``status``,
``logs`` and ``results`` make (``launcher.service``), so the pages and the commands never disagree.
A part that cannot be read (a scheduler out of reach) is named in ``problems`` instead of failing
the page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.core.errors import DdpjobError

if TYPE_CHECKING:
    from launcher.core.progress import Progress
    from launcher.service.compare import Comparison
    from launcher.service.jobs import Jobs
    from launcher.service.registry import JobRecord
    from launcher.service.results import RunResult
    from launcher.targets.jobstatus import JobStatus
    from launcher.targets.shared.health import JobHealth

LOG_TAIL = 40  # lines of each node's log on the job page
LOG_NODES = 8  # nodes whose logs the job page shows (the others: ddpjob logs ID --node N)
_PLAN_MAX = 64 * 1024


@dataclass
class JobRow:
    rec: JobRecord
    progress: Progress | None


@dataclass
class JobView:
    """One job as its page shows it; ``task`` is the run whose nodes and logs are shown."""

    rec: JobRecord
    status: JobStatus | None
    progress: Progress | None
    runs: list[RunResult]
    task: int
    logs: list[tuple[int, list[str]]]  # (node, its last lines)
    problems: list[str] = field(default_factory=list)
    nodes: int = 1
    health: JobHealth | None = None  # every rank's health, as ddpjob top shows it

    @property
    def procs_per_node(self) -> int | None:
        return self.rec.shape.procs_per_node if self.rec.shape else None


@dataclass(frozen=True)
class JobFilter:
    """Which jobs the jobs page shows: a state, a target, and text the id or name holds (any case);
    empty: any."""

    state: str = ""
    target: str = ""
    name: str = ""

    @property
    def active(self) -> bool:
        return bool(self.state or self.target or self.name)

    def params(self) -> dict[str, str | None]:
        """The filter as a page's query (the unset parts left out)."""
        return {"state": self.state or None, "target": self.target or None, "name": self.name or None}

    def keeps(self, rec: JobRecord) -> bool:
        name = self.name.lower()
        return ((not self.state or rec.state.value == self.state) and (not self.target or rec.target == self.target)
                and (not name or name in rec.id.lower() or name in rec.name.lower()))


def job_rows(jobs: Jobs, limit: int = 100, flt: JobFilter | None = None) -> list[JobRow]:
    """The newest jobs (those ``flt`` keeps), unfinished ones refreshed, with their progress
    (``ddpjob list``)."""
    rows = []
    flt = flt or JobFilter()
    # A filter looks past the newest ``limit`` jobs: the newest ``limit`` of those it keeps.
    recs = jobs.list_jobs(limit=None if flt.active else limit, target=flt.target or None)
    for rec in [r for r in recs if flt.keeps(r)][:limit]:
        progress = None
        if not rec.state.terminal:
            try:
                progress = jobs.progress(rec)
            except DdpjobError:
                progress = None
        rows.append(JobRow(rec, progress))
    return rows


def _runs_of(rec: JobRecord) -> int:
    value = rec.shape.runs if rec.shape else None
    return value if value is not None and value > 0 else 1


def _nodes_of(rec: JobRecord) -> int:
    value = rec.shape.nodes if rec.shape else rec.summary.nodes
    return value if value is not None and value > 0 else 1


def job_view(jobs: Jobs, job_id: str, task: int | None = None, tail: int = LOG_TAIL) -> JobView:
    """The job's record, status, progress, runs with their curves, and the last lines of each node
    of run ``task`` (default: the latest run that has started). ``JobNotFound`` for an unknown id."""
    from launcher.service.results import job_results
    from launcher.targets.base import LogFilter

    problems: list[str] = []
    rec = jobs.get(job_id)
    try:
        rec, st = jobs.refresh(rec.id)
    except DdpjobError as e:
        st = None
        problems.append(f"status: {e}")
    progress = runs = None
    try:
        progress = jobs.progress(rec)
        runs = job_results(jobs, rec.id)
    except DdpjobError as e:
        problems.append(f"results: {e}")
    count = _runs_of(rec)
    if task is None or not 0 <= task < count:
        started = [t.index for t in (st.tasks if st else []) if t.state.value != "PENDING"]
        task = max(started) if started else 0
    logs: list[tuple[int, list[str]]] = []
    if rec.handle is not None:
        for node in range(min(_nodes_of(rec), LOG_NODES)):
            flt = LogFilter(task=task if count > 1 else None, node=node, tail=tail)
            try:
                logs.append((node, list(jobs.logs(rec.id, flt, follow=False))))
            except DdpjobError as e:
                problems.append(f"logs of node {node}: {e}")
    try:
        health = jobs.health(rec)
    except DdpjobError as e:
        health = None
        problems.append(f"ranks: {e}")
    return JobView(rec, st, progress, runs or [], task, logs, problems, _nodes_of(rec), health)


def compare_view(jobs: Jobs, job_ids: list[str]) -> Comparison:
    """The runs of the jobs ``job_ids`` side by side (``ddpjob results ID ID ...``). ``JobNotFound``
    naming every unknown id."""
    from launcher.service.compare import compare

    return compare(jobs, job_ids)


def spec_text(rec: JobRecord) -> str:
    """The spec as submitted, as YAML, with the values of secret-looking variables masked
    (``launcher.spec.secrets``, as ``status -o json`` shows it); unset fields and the sections of
    other targets are left out."""
    import yaml

    from launcher.core.plugins import target_names
    from launcher.spec.secrets import mask_spec

    spec = {k: v for k, v in mask_spec(rec.spec).items() if k not in target_names() or k == rec.target}
    return str(yaml.safe_dump(_set_only(spec), sort_keys=False, default_flow_style=None, allow_unicode=True,
                              width=100))


def _set_only(value: object) -> object:
    if isinstance(value, dict):
        return {k: _set_only(v) for k, v in value.items() if v not in (None, [], {})}
    return value


def plan_text(rec: JobRecord) -> str | None:
    """The run directory's ``plan.txt`` (what was submitted, secret values masked), cut to 64 KiB."""
    from launcher.targets.shared.runfolder import PLAN_TEXT, RunFolder

    try:
        with open(RunFolder(rec.run_dir).plan_text, encoding="utf-8", errors="replace") as f:
            text = f.read(_PLAN_MAX + 1)
    except OSError:
        return None
    return text if len(text) <= _PLAN_MAX else text[:_PLAN_MAX] + f"\n... (cut: the whole plan is in {PLAN_TEXT})\n"
