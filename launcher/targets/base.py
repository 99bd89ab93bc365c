"""The target interface: what every target (local, slurm, k8s) implements.

``plan(spec, ctx) -> Plan`` is pure: no I/O, no cluster calls, deterministic given the context.
What ``Plan.render()`` prints (``ddpjob render``, ``submit --dry-run``) is exactly what
``submit(plan)`` hands to the scheduler.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from launcher.specload import LoadedSpec
from launcher.states import JobState


@dataclass(frozen=True)
class PlanContext:
    """Everything ``plan`` may depend on besides the spec; fixed values make renders reproducible.

    Attributes:
        job_id: the registry id (also the Kubernetes name, the Slurm job name).
        run_dir: the job's local directory (logs, state, plan).
        port: a rendezvous port chosen at submit time (local target), else None.
        cpu_count: cores of this machine (local OMP_NUM_THREADS).
        gpu_count: GPUs of this machine (local ``procs_per_node: auto``).
        home: the user's home (Slurm's default folder); ``cwd``: where ddpjob was run.
        python: the interpreter that runs torchrun locally.
    """

    job_id: str
    run_dir: str
    port: int | None = None
    cpu_count: int = 2
    gpu_count: int = 0
    home: str = "/home/user"
    cwd: str = "/work"
    python: str = "python3"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """A printable, submittable request. ``payload`` is target-specific and JSON-serialisable."""

    target: str
    job_id: str
    name: str
    run_dir: str
    text: str
    payload: dict[str, Any]
    port: int | None = None

    def render(self) -> str:
        return self.text


@dataclass
class TaskStatus:
    """One run of a job (a sweep element, or the only run) and, where known, its nodes."""

    index: int
    state: JobState
    message: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    native_id: str | None = None


@dataclass
class JobStatus:
    """What ``ddpjob status`` shows. ``message`` carries the root cause of a failure."""

    state: JobState
    message: str = ""
    tasks: list[TaskStatus] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "message": self.message,
            "details": self.details,
            "tasks": [
                {"index": t.index, "state": t.state.value, "message": t.message, "nodes": t.nodes,
                 "params": t.params, "native_id": t.native_id}
                for t in self.tasks
            ],
        }


@dataclass(frozen=True)
class LogFilter:
    """Which lines ``logs`` yields. None means all."""

    task: int | None = None
    node: int | None = None
    rank: int | None = None
    tail: int | None = None


class Target(abc.ABC):
    """One execution backend. Implementations import heavy clients lazily, inside methods."""

    name: str

    @abc.abstractmethod
    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan:
        """Build the request. Pure; raises ``SpecError`` (via ``loaded.error``) for target-specific problems."""

    @abc.abstractmethod
    def submit(self, plan: Plan) -> dict[str, Any]:
        """Hand ``plan`` to the scheduler; return the handle (JSON-serialisable) stored in the registry."""

    @abc.abstractmethod
    def status(self, handle: dict[str, Any]) -> JobStatus:
        """Current state, per task and node, with the root cause of a failure when known."""

    @abc.abstractmethod
    def logs(self, handle: dict[str, Any], flt: LogFilter, follow: bool = False) -> Iterator[str]:
        """Lines of output, each prefixed with where it came from (task, node, rank).

        Contract (every target):
        1. Without ``follow``: yield what exists now, then stop; a job that has not started yet
           yields nothing (no error).
        2. With ``follow``: yield existing lines, then new ones as they appear, waiting for logs
           that do not exist yet (pending nodes/pods); stop once the job is terminal and every
           source is drained.
        3. ``tail=N`` limits the existing lines to the last N per source before following.
        4. Lines never lose their order within one source; lines of different sources interleave.
        """

    @abc.abstractmethod
    def cancel(self, handle: dict[str, Any]) -> None:
        """Stop the job and everything it started. Safe to repeat; a finished job is left as it is."""

    def status_many(self, handles: dict[str, dict[str, Any]]) -> dict[str, JobStatus]:
        """Status of several jobs (``ddpjob list``). Targets with a batch query override this
        to ask once for all jobs instead of once per job."""
        return {job_id: self.status(h) for job_id, h in handles.items()}

    def server_dry_run(self, plan: Plan) -> str:
        """Ask the scheduler to check ``plan`` without running it (``submit --dry-run=server``)."""
        from launcher.errors import UsageError

        raise UsageError(f"--dry-run=server is not supported by the {self.name} target; use --dry-run")
