"""A target chosen by name at run time, as the service holds it (``lookup.get_target``).

A ``Target[Payload, Handle]`` keeps its own types paired: its ``plan`` makes what its ``submit``
takes, its ``submit`` returns what its ``status``, ``logs`` and ``cancel`` take back. The service
walks one path for every target, so it holds a ``Chosen``: the same calls with those types kept
inside. A plan handed back is checked to be the target's own (``Target.owns``); a handle stored in
the registry is read back by its target (``Target.load_handle``) into a ``Bound`` job, which pairs
the two for every later call. No ``Any`` and no ``cast`` on the way. A call of a capability
(``launcher.targets.capabilities``) the target lacks is a ``UsageError`` naming the targets that have it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from launcher.core.errors import UsageError
from launcher.targets.base import Handle, LogFilter, Plan, PlanContext, Target
from launcher.targets.capabilities import CancelsTasks, DryRunsOnServer, PicksPorts, ReadsStacks, lacking

if TYPE_CHECKING:
    from launcher.core.errors import Issue
    from launcher.core.progress import Progress
    from launcher.core.states import JobState
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.jobstatus import JobStatus
    from launcher.targets.shared.health import JobHealth
    from launcher.targets.shared.stacks import JobStacks

PayloadT = TypeVar("PayloadT")
HandleT = TypeVar("HandleT", bound=Handle)


class Bound(Protocol):
    """One recorded job and its target: each call is the target's (``Target``) with its handle."""

    @property
    def handle(self) -> Handle: ...
    def status(self) -> JobStatus: ...
    def recorded_status(self, state: JobState, message: str, why: str) -> JobStatus: ...
    def logs(self, flt: LogFilter, follow: bool = False) -> Iterator[str]: ...
    def cancel(self) -> None: ...
    def cancel_task(self, index: int) -> None: ...
    def still_held(self) -> bool: ...
    def cancel_note(self) -> str | None: ...
    def progress(self) -> Progress | None: ...
    def health(self) -> JobHealth | None: ...
    def stacks(self, flt: LogFilter) -> JobStacks: ...
    def stage(self, status: JobStatus) -> str: ...


class Chosen(Protocol):
    """A target as the service uses it: ``Target``'s calls, plans and stored handles checked to be its own."""

    @property
    def name(self) -> str: ...
    @property
    def picks_port(self) -> bool: ...
    @property
    def passes_host_env(self) -> bool: ...
    @property
    def metrics_elsewhere(self) -> str | None: ...
    def preflight(self, loaded: LoadedSpec, ctx: PlanContext) -> list[Issue]: ...
    def inputs(self, loaded: LoadedSpec, *, online: bool) -> object: ...
    def runs_image(self, spec: JobSpec) -> bool: ...
    def pick_port(self, busy: set[int]) -> int: ...
    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan[object]: ...
    def submit(self, plan: Plan[object]) -> Handle: ...
    def server_dry_run(self, plan: Plan[object]) -> str: ...
    def bind(self, data: dict[str, object]) -> Bound: ...
    def status_many(self, handles: dict[str, dict[str, object]]) -> dict[str, JobStatus]: ...


def chosen(target: Target[PayloadT, HandleT]) -> Chosen:
    """``target`` as the service holds it."""
    return _Chosen(target)


class _Chosen(Generic[PayloadT, HandleT]):
    def __init__(self, target: Target[PayloadT, HandleT]) -> None:
        self.target = target

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def picks_port(self) -> bool:
        return isinstance(self.target, PicksPorts)

    @property
    def passes_host_env(self) -> bool:
        return self.target.passes_host_env

    @property
    def metrics_elsewhere(self) -> str | None:
        return self.target.metrics_elsewhere

    def preflight(self, loaded: LoadedSpec, ctx: PlanContext) -> list[Issue]:
        return self.target.preflight(loaded, ctx)

    def inputs(self, loaded: LoadedSpec, *, online: bool) -> object:
        return self.target.inputs(loaded, online=online)

    def runs_image(self, spec: JobSpec) -> bool:
        return self.target.runs_image(spec)

    def pick_port(self, busy: set[int]) -> int:
        if not isinstance(self.target, PicksPorts):
            raise UsageError(lacking(PicksPorts, self.name, "picking the rendezvous port", "set master_port"))
        return self.target.pick_port(busy)

    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan[object]:
        return self.target.plan(loaded, ctx)

    def submit(self, plan: Plan[object]) -> Handle:
        return self.target.submit(self._own(plan))

    def server_dry_run(self, plan: Plan[object]) -> str:
        if not isinstance(self.target, DryRunsOnServer):
            raise UsageError(lacking(DryRunsOnServer, self.name, "--dry-run=server", "use --dry-run"))
        return self.target.server_dry_run(self._own(plan))

    def bind(self, data: dict[str, object]) -> Bound:
        return _Bound(self.target, self.target.load_handle(data))

    def status_many(self, handles: dict[str, dict[str, object]]) -> dict[str, JobStatus]:
        return self.target.status_many({job_id: self.target.load_handle(data) for job_id, data in handles.items()})

    def _own(self, plan: Plan[object]) -> Plan[PayloadT]:
        if not self.target.owns(plan):
            raise TypeError(f"a plan for the {plan.target} target handed to the {self.target.name} target")
        return plan


class _Bound(Generic[PayloadT, HandleT]):
    def __init__(self, target: Target[PayloadT, HandleT], handle: HandleT) -> None:
        self.target, self._handle = target, handle

    @property
    def handle(self) -> Handle:
        return self._handle

    def status(self) -> JobStatus:
        return self.target.status(self._handle)

    def recorded_status(self, state: JobState, message: str, why: str) -> JobStatus:
        return self.target.recorded_status(self._handle, state, message, why)

    def logs(self, flt: LogFilter, follow: bool = False) -> Iterator[str]:
        return self.target.logs(self._handle, flt, follow=follow)

    def cancel(self) -> None:
        self.target.cancel(self._handle)

    def cancel_task(self, index: int) -> None:
        if not isinstance(self.target, CancelsTasks):
            raise UsageError(lacking(CancelsTasks, self.target.name, "--task", "cancel the whole job"))
        self.target.cancel_task(self._handle, index)

    def still_held(self) -> bool:
        return self.target.still_held(self._handle)

    def cancel_note(self) -> str | None:
        return self.target.cancel_note(self._handle)

    def progress(self) -> Progress | None:
        return self.target.progress(self._handle)

    def health(self) -> JobHealth | None:
        return self.target.health(self._handle)

    def stacks(self, flt: LogFilter) -> JobStacks:
        if not isinstance(self.target, ReadsStacks):
            raise UsageError(lacking(ReadsStacks, self.target.name, "ddpjob stacks",
                                     "look at a rank's last lines with ddpjob logs ID --rank R"))
        return self.target.stacks(self._handle, flt)

    def stage(self, status: JobStatus) -> str:
        return self.target.stage(self._handle, status)
