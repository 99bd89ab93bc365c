"""Runs of several jobs side by side: ``ddpjob results ID ID ...``, ``ddpjob plot ID ID ...`` and the
dashboard's compare view.

Each run (a sweep element, or a job's only run) is described by its *facets*, read from what its job
recorded: the target, nodes and processes per node (the submitted plan's shape), the image (a digest
after ``build:``), the spec's other set values flattened to dotted names (``env.LR``, ``workdir``,
``resources.cpus``; the command's ``--option value`` pairs one by one as ``command --option``, the
rest of it as ``command``), and the run's sweep values. The target's own section (``slurm.time``)
counts only when every job has the same target: across targets the ``target`` facet already tells
them apart. A facet whose value is the same in every run is *shared* (said once, above the table);
the others *differ* and become the table's columns and the curves' labels. Secret-looking values
are masked in the registry (``***``) and stay so here.

Pure standard library, like ``launcher.service.results``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.service.results import RunResult, job_results, metrics_elsewhere

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs
    from launcher.service.registry import JobRecord

# Facets of the job's shape and where it ran, first in every table, in this order.
JOB_FACETS = ("target", "nodes", "procs", "image")
# Spec fields that are no facet of their own: the name (the job id says it), the sweep (each run's
# values are), the shape (``nodes``, ``procs``), the notification (nothing about the run).
_NOT_FACETS = frozenset({"name", "sweep", "nodes", "procs_per_node", "notify", "master_port"})
_LIST_HINT = "; run `ddpjob list` to see your jobs"  # JobNotFound's own ending, said once for all
MISSING = "-"  # a facet a run does not have (another target's option, a command option it lacks)


@dataclass(frozen=True)
class ComparedRun:
    """One run of one of the compared jobs.

    Attributes:
        job_id: the job's full id.
        target: the job's target.
        run: the run's results (``launcher.service.results``).
        label: ``ID`` for a job's only run, ``ID/N`` for run N of a sweep.
        facets: every facet of the run, as text.
    """

    job_id: str
    target: str
    run: RunResult
    label: str
    facets: dict[str, str]


@dataclass(frozen=True)
class Comparison:
    """The runs of several jobs, what they share and what tells them apart.

    Attributes:
        runs: every run of every job, jobs in the order given, runs in sweep order.
        differing: the facets whose values are not all the same, in the table's order.
        shared: the facets every run has with the same value.
        notes: ``(job id, why)`` for each job none of whose runs has metrics.
    """

    runs: list[ComparedRun]
    differing: list[str]
    shared: dict[str, str]
    notes: list[tuple[str, str]]

    def differs(self, run: ComparedRun) -> dict[str, str]:
        """The run's values of the differing facets."""
        return {k: run.facets.get(k, MISSING) for k in self.differing}

    def label(self, run: ComparedRun) -> str:
        """``ID/N: lr=0.1 target=slurm``: the run and its differing values (a curve's legend)."""
        values = " ".join(f"{k}={short(v)}" for k, v in self.differs(run).items())
        return f"{run.label}: {values}" if values else run.label


def compare(jobs: Jobs, job_ids: list[str]) -> Comparison:
    """The runs of the jobs ``job_ids`` (unique prefixes are enough; a job named twice counts once).

    Raises:
        JobNotFound: an id that names no job, or several (every unknown id is named at once).
    """
    from launcher.core.errors import JobNotFound

    records: list[JobRecord] = []
    unknown: list[str] = []
    for job_id in job_ids:
        try:
            rec = jobs.get(job_id)
        except JobNotFound as e:
            unknown.append(str(e).removesuffix(_LIST_HINT))
            continue
        if rec.id not in {r.id for r in records}:
            records.append(rec)
    if unknown:
        raise JobNotFound(job_ids[0], why="; ".join(unknown))
    same_target = len({r.target for r in records}) == 1
    runs: list[ComparedRun] = []
    notes: list[tuple[str, str]] = []
    for rec in records:
        results = job_results(jobs, rec.id)
        base = job_facets(rec, with_target_section=same_target)
        for r in results:
            label = rec.id if len(results) == 1 and not r.values else f"{rec.id}/{r.index}"
            runs.append(ComparedRun(rec.id, rec.target, r, label, {**base, **_sweep_facets(r.values, base)}))
        why = no_metrics_note(rec, results)
        if why:
            notes.append((rec.id, why))
    return _split(runs, notes)


def _split(runs: list[ComparedRun], notes: list[tuple[str, str]]) -> Comparison:
    order: list[str] = []
    for run in runs:
        order += [k for k in run.facets if k not in order]
    ranked = [k for k in JOB_FACETS if k in order] + [k for k in order if k not in JOB_FACETS]
    shared = {k: runs[0].facets[k] for k in ranked
              if all(k in r.facets for r in runs) and len({r.facets[k] for r in runs}) == 1} if runs else {}
    return Comparison(runs, [k for k in ranked if k not in shared], shared, notes)


def no_metrics_note(rec: JobRecord, runs: list[RunResult]) -> str | None:
    """Why none of the job's runs has metrics (None when one has)."""
    if not runs:
        return "no runs: the job's submission did not complete (ddpjob status ID says why)"
    if any(r.curves for r in runs):
        return None
    if elsewhere := metrics_elsewhere(rec.target):
        return f"no metrics: {elsewhere}"
    return "no metrics yet: its program has not appended a line with a step to $DDPJOB_METRICS_FILE"


def job_facets(rec: JobRecord, *, with_target_section: bool) -> dict[str, str]:
    """The facets of the job ``rec`` (those of its runs less their sweep values)."""
    from launcher.core.plugins import target_names

    shape, spec = rec.shape, rec.summary
    out = {"target": rec.target, "nodes": _text(shape.nodes if shape else spec.nodes),
           "procs": _text(shape.procs_per_node if shape else spec.procs_per_node),
           "image": _text(spec.image)}
    for key, value in rec.spec.items():
        if key in _NOT_FACETS or key == "image" or key in JOB_FACETS:
            continue
        if key in target_names() and (key != rec.target or not with_target_section):
            continue
        if key == "command" and isinstance(value, list):
            out.update(command_facets([str(v) for v in value]))
        else:
            _flatten(key, value, out)
    return out


def command_facets(argv: list[str]) -> dict[str, str]:
    """``[python, train.py, --lr, 0.1, --amp]`` -> ``{command: python train.py, command --lr: 0.1,
    command --amp: yes}``: each option apart, so two commands that differ in one option differ in one
    column. An option given twice keeps every value."""
    import shlex

    head: list[str] = []
    options: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and len(arg) > 1 and not _is_number(arg) and arg != "--":
            name, eq, value = arg.partition("=")
            if not eq:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if nxt is not None and (not nxt.startswith("-") or _is_number(nxt)):
                    value, i = nxt, i + 1
                else:
                    value = "yes"
            options.setdefault(f"command {name}", []).append(value)
        elif not options:
            head.append(arg)
        else:  # a positional after the options: part of the last option's value
            last = next(reversed(options))
            options[last].append(arg)
        i += 1
    out = {"command": shlex.join(head)} if head else {}
    return {**out, **{k: " ".join(v) for k, v in options.items()}}


def short(value: str, most: int = 48) -> str:
    """A facet's value for a table or a legend: a digest cut to 12 characters, a long value to ``most``."""
    import re

    value = re.sub(r"@sha256:([0-9a-f]{12})[0-9a-f]{52}\b", r"@sha256:\1", value)
    return value if len(value) <= most else value[:most - 3] + "..."


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _sweep_facets(values: dict[str, object], base: dict[str, str]) -> dict[str, str]:
    """A run's sweep values as facets (``lr``; ``sweep.image`` where a job facet has the key's name)."""
    return {(f"sweep.{k}" if k in base else k): _text(v) for k, v in values.items()}


def _flatten(prefix: str, value: object, out: dict[str, str]) -> None:
    """Set values only: None, ``[]`` and ``{}`` are no facet (unset is unset everywhere)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)
    elif value not in (None, [], {}):
        out[prefix] = _text(value)


def _text(value: object) -> str:
    import json

    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return " ".join(str(v) for v in value)
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else str(value)
