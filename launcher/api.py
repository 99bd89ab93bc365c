"""The Python API: submit and follow ddpjob jobs from a notebook, a pipeline or a script.

It walks the same path as the command line (``launcher.service.jobs``), so a job submitted here is a job
like any other: ``ddpjob status/logs/cancel`` see it, and ``get`` finds CLI jobs.

Example::

    from launcher import api

    job = api.submit("quickstart.yaml", target="local", nodes=2)   # `ddpjob init` writes it
    state = job.wait()                       # JobState.SUCCEEDED
    for line in job.logs(rank=1, tail=5):
        print(line)
    best = min(job.results(), key=lambda run: run.best.get("loss", float("inf")))  # per run: values, metrics
    again = api.get(job.id)
    print([j.id for j in api.list_jobs()])

Errors are typed (all are ``DdpjobError``): ``SpecError`` (its ``issues`` list every problem
with its field path), ``JobNotFound``, ``TargetUnavailable``, ``SubmitRejected``, ``WaitTimeout``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

from launcher.core.errors import (
    DdpjobError,
    Issue,
    JobNotFound,
    SpecError,
    SubmitRejected,
    TargetUnavailable,
    WaitTimeout,
)
from launcher.core.states import JobState
from launcher.service.jobs import Jobs, load
from launcher.service.results import RunResult, job_results
from launcher.targets.base import LogFilter
from launcher.targets.jobstatus import JobStatus

__all__ = [
    "DdpjobError", "Job", "JobNotFound", "JobState", "JobStatus", "RunResult", "SpecError", "SubmitRejected",
    "TargetUnavailable", "WaitTimeout", "get", "list_jobs", "submit",
]


class Job:
    """A submitted job, found by its id in the registry (``$DDPJOB_HOME``)."""

    def __init__(self, job_id: str, jobs: Jobs | None = None) -> None:
        self._jobs = jobs or Jobs()
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def target(self) -> str:
        return self._jobs.get(self.id).target

    def status(self) -> JobStatus:
        """The current state (``.state``, a ``JobState``), message (the root cause of a failure),
        runs (``.tasks``) and details, asked of the target now."""
        rec, st = self._jobs.refresh(self.id)
        if st is None:
            return JobStatus(rec.state, rec.message)
        return JobStatus(rec.state, rec.message or st.message, st.tasks, st.details, source=st.source)

    def wait(self, timeout: float | None = None, on_end: Callable[[Job], object] | None = None) -> JobState:
        """Block until the job ends; its final state. ``WaitTimeout`` after ``timeout`` seconds.

        ``on_end(job)`` is called once when the job has ended (not after a timeout), e.g. to send
        a message from your own program; the spec's ``notify:`` is sent by ddpjob itself, also
        when no program waits."""
        state = self._jobs.wait(self.id, timeout).state
        if on_end is not None:
            on_end(self)
        return state

    def logs(self, follow: bool = False, node: int | None = None, rank: int | None = None,
             task: int | None = None, tail: int | None = None) -> Iterator[str]:
        """Lines of output, each prefixed with its node and rank (``follow``: until the job ends)."""
        return self._jobs.logs(self.id, LogFilter(task=task, node=node, rank=rank, tail=tail), follow=follow)

    def cancel(self) -> None:
        """Stop the job and every process it started; safe to repeat."""
        self._jobs.cancel(self.id)

    def results(self) -> list[RunResult]:
        """Each run's sweep values, state, duration and metrics (final, best, curves), as ``ddpjob results``."""
        return job_results(self._jobs, self.id)


def submit(
    spec: str | os.PathLike[str] | Mapping[str, object] | None = None,
    *,
    target: str | None = None,
    nodes: int | None = None,
    procs_per_node: int | str | None = None,
    name: str | None = None,
    overrides: Mapping[str, object] | Sequence[str] | None = None,
    command: Sequence[str] | None = None,
) -> Job:
    """Submit a job and return at once.

    Args:
        spec: a spec file, a spec as a dict, or None with ``command``.
        target: ``local``, ``slurm`` or ``k8s``; default: the project file's (``.ddpjob.yaml``) or
            user config's target, else ``local``. Those files fill what the spec leaves out, as
            for the command line (``ddpjob config show``).
        nodes, procs_per_node, name: as ``--nodes``, ``--procs-per-node``, ``--name``.
        overrides: ``{"resources.cpus": 4, "env.SEED": "1"}`` or ``["resources.cpus=4"]`` (as ``--set``).
        command: the program when there is no spec, e.g. ``["python", "train.py", "--lr", "0.1"]``.
    """
    sets = _overrides(overrides)
    sets += [_set(k, v) for k, v in (("nodes", nodes), ("procs_per_node", procs_per_node), ("name", name))
             if v is not None]
    if command is not None and (isinstance(command, (str, bytes, bytearray)) or not isinstance(command, Sequence)):
        raise SpecError(None, [Issue(("command",), f"give the command as a list of strings, not a {type(command).__name__}",
                                     'e.g. command=["python", "train.py", "--lr", "0.1"]', source="command=")])
    if isinstance(spec, Mapping):
        from launcher.spec.defaults import layers
        from launcher.spec.load import load_spec

        base = dict(spec)
        if command is not None:
            base["command"] = list(command)
        loaded = load_spec(None, overrides=sets, base=base, defaults=layers())
    elif spec is not None:
        loaded = load(os.fspath(spec), overrides=sets)
    else:
        loaded = load(None, command=list(command or []), overrides=sets)
    jobs = Jobs()
    return Job(jobs.submit(loaded, loaded.chosen_target(target)).job_id, jobs)


def get(job_id: str) -> Job:
    """The job with this id (or a unique prefix of it); ``JobNotFound`` otherwise."""
    if not isinstance(job_id, str):
        raise JobNotFound(f"<{type(job_id).__name__}>", why=f"a job id is a string (as `ddpjob list` shows it), not {type(job_id).__name__}")
    jobs = Jobs()
    return Job(jobs.get(job_id).id, jobs)


def list_jobs(limit: int | None = None) -> list[Job]:
    """Jobs, newest first (their states refreshed as ``ddpjob list`` does)."""
    jobs = Jobs()
    return [Job(rec.id, jobs) for rec in jobs.list_jobs(limit=limit)]


def _overrides(overrides: Mapping[str, object] | Sequence[str] | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [_set(str(key), value) for key, value in overrides.items()]
    return [str(o) for o in overrides]


def _set(key: str, value: object) -> str:
    """``key=value`` as ``--set`` takes it; a value no spec can hold is a ``SpecError`` naming the key."""
    try:
        # JSON is YAML: a string stays the exact string, numbers and lists keep their type.
        return f"{key}={json.dumps(value)}"
    except ValueError:  # an int of more digits than Python writes out
        problem = "a number of more than 4,300 digits is too long to read"
    except TypeError:
        problem = f"a {type(value).__name__} is not a spec value (strings, numbers, booleans, lists, mappings)"
    raise SpecError(None, [Issue(tuple(key.split(".")), problem, source=f"{key}=")])
