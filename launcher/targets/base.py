"""The target interface: what every target (local, slurm, k8s) implements.

``plan(spec, ctx) -> Plan`` is pure: no I/O, no cluster calls, deterministic given the context.
What ``Plan.render()`` prints (``ddpjob render``, ``submit --dry-run``) is rendered from the very
payload that ``submit(plan)`` hands to the scheduler (secret values shown masked). ``submit``
returns the target's ``Handle`` (a dataclass stored as JSON in the registry); ``status``, ``logs``
and ``cancel`` take it back. What only some targets do is in ``launcher.targets.capabilities``. The
service holds a target chosen by name through ``launcher.targets.chosen``, which keeps each target's
payload and handle types paired inside it.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeGuard, TypeVar

from launcher.core.states import JobState
from launcher.targets.jobstatus import JobStatus
from launcher.targets.shared.files import read_json, to_json

if TYPE_CHECKING:
    from launcher.core.errors import Issue
    from launcher.core.progress import Progress
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.shared.health import JobHealth


@dataclass(frozen=True)
class PlanContext:
    """Everything ``plan`` may depend on besides the spec; fixed values make renders reproducible.

    Attributes:
        job_id: the registry id (also the Kubernetes name, the Slurm job name).
        run_dir: the job's local directory (logs, state, plan).
        port: the rendezvous port reserved at submit time for targets that pick one (local);
            None when it is not chosen yet (``render``, ``--dry-run``): the plan then says so.
        cpu_count: cores of this machine (local OMP_NUM_THREADS).
        gpu_count: GPUs of this machine (local ``procs_per_node: auto``).
        home: the user's home (Slurm's default folder); ``cwd``: where ddpjob was run.
        ddpjob_home: ``$DDPJOB_HOME`` where it is set (then Slurm's default folder is under it), else None.
        python: the interpreter that runs torchrun locally.
        inputs: what the target read from outside before planning (``Target.inputs``), e.g. the
            CRD to validate against; part of the plan's input, never read inside ``plan``.
        port_command: for targets that pick a port, the command (owned by the service) that a
            running job calls for a new one when another program took its port before the
            rendezvous; it prints the port, recorded for the job. Empty in render and dry runs.
    """

    job_id: str
    run_dir: str
    port: int | None = None
    cpu_count: int = 2
    gpu_count: int = 0
    home: str = "/home/user"
    cwd: str = "/work"
    python: str = "python3"
    inputs: object = None
    port_command: tuple[str, ...] = ()
    ddpjob_home: str | None = None


@dataclass
class Handle:
    """What a target needs to find a submitted job again; each target adds its own fields."""

    job_id: str
    run_dir: str

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = to_json(self)
        return data

    def native_ids(self) -> list[str]:
        """The scheduler's own ids of the job (Slurm job id, Kubernetes object names); [] for none."""
        return []

    def log_dir(self) -> str | None:
        """Where the nodes' logs live when not under the run directory (a Slurm job folder), else None."""
        return None


PayloadT = TypeVar("PayloadT")
# A plan is made once and only read after (frozen; ``renderer`` is applied to its own payload only),
# so a ``Plan[LocalPayload]`` is a ``Plan[object]``: what the service holds of any target's plan.
PayloadT_co = TypeVar("PayloadT_co", covariant=True)
HandleT = TypeVar("HandleT", bound=Handle)


@dataclass(frozen=True)
class Plan(Generic[PayloadT_co]):
    """A printable, submittable request, planned once. ``payload`` is the target's own typed request
    and ``renderer`` the target's text of a payload; ``checks`` says what the plan was checked against
    beyond the spec's own rules (``ddpjob validate`` prints it).

    What people see (``render``, ``submit --dry-run``, ``plan.txt``) is ``render()``: the payload's
    text with the values of the env variables named in ``masked`` shown as ``***``, then ``notes``.
    Both are the service's (``launcher.service.shown``): a target builds its plan with neither.
    """

    target: str
    job_id: str
    name: str
    run_dir: str
    payload: PayloadT_co
    renderer: Callable[[PayloadT_co, frozenset[str]], str]
    nodes: int
    procs_per_node: int
    runs: int = 1
    port: int | None = None
    checks: str = ""
    masked: frozenset[str] = frozenset()
    notes: str = ""

    def render(self, *, masked: bool = True, runs: int | None = None) -> str:
        """The text of ``payload`` for people; ``masked=False`` shows every value as submitted.

        A sweep of many runs is summarised so that the text stays small: the first ``runs``
        (default ``$DDPJOB_RENDER_RUNS``, else 3 of more than 10; ``all`` for every one) in full, then one line per
        further run with its parameters. The payload lists its runs in ``elements`` (each with
        ``index`` and ``params``; a parallel ``manifests`` list is cut with them), so the text of
        the first runs is the real one's head."""
        shown = shown_runs(self.runs) if runs is None else runs
        payload, rest = _first_runs(self.payload, shown) if self.runs > shown else (self.payload, [])
        text = self.renderer(payload, self.masked if masked else frozenset())
        if rest:
            lines = [f"\n## tasks {shown}..{self.runs - 1}: as the tasks above, each with its own parameters and "
                     "output folder (DDPJOB_RENDER_RUNS=all shows every run in full, DDPJOB_RENDER_RUNS=N the "
                     "first N):"]
            lines += [f"## task {el.index}" + "".join(f" {k}={v}" for k, v in el.params.items()) for el in rest]
            text += "\n".join(lines) + "\n"
        return text + self.notes

    def shape(self) -> str:
        """``2 node(s) x 1 process(es), 4 runs (sweep), rendezvous port 23456``."""
        text = f"{self.nodes} node(s) x {self.procs_per_node} process(es)"
        if self.runs > 1:
            text += f", {self.runs} runs (sweep)"
        if self.port:
            text += f", rendezvous port {self.port}"
        return text


SHOWN_RUNS = 3  # runs in full when a sweep is summarised
FULL_UP_TO = 10  # a sweep of at most this many runs is shown in full


def shown_runs(total: int) -> int:
    """How many of a sweep's ``total`` runs a render shows in full: ``$DDPJOB_RENDER_RUNS`` (a number
    or ``all``), else all of up to 10 runs and the first 3 of more."""
    value = os.environ.get("DDPJOB_RENDER_RUNS", "").strip().lower()
    if value == "all":
        return sys.maxsize
    if value.isdigit() and len(value) < 10:
        return max(1, int(value))
    return total if total <= FULL_UP_TO else SHOWN_RUNS


class _Run(Protocol):
    """A run as a payload lists it in ``elements`` (the summary of a sweep names each)."""

    index: int
    params: dict[str, str]


def _first_runs(payload: PayloadT, count: int) -> tuple[PayloadT, list[_Run]]:
    """``payload`` with only its first ``count`` runs, and the runs left out."""
    elements = getattr(payload, "elements", None)
    if not dataclasses.is_dataclass(payload) or isinstance(payload, type) or not isinstance(elements, list):
        return payload, []
    cut: dict[str, list[object]] = {"elements": elements[:count]}
    manifests = getattr(payload, "manifests", None)
    if isinstance(manifests, list) and len(manifests) == len(elements):
        cut["manifests"] = manifests[:count]
    return dataclasses.replace(payload, **cut), elements[count:]


@dataclass(frozen=True)
class LogFilter:
    """Which lines ``logs`` yields. None means all."""

    task: int | None = None
    node: int | None = None
    rank: int | None = None
    tail: int | None = None
    verbose: bool = False  # also torchrun's own log records and tracebacks (logtail.AgentNoise)


class Target(abc.ABC, Generic[PayloadT, HandleT]):
    """One execution backend. Implementations import heavy clients lazily, inside methods.

    Type parameters: the request its ``plan`` builds and its ``submit`` takes (``Plan[PayloadT]``:
    what dry-run prints is what is submitted), and the handle ``submit`` returns and every later
    call takes back. ``owns`` and ``load_handle`` say at run time which plans and stored handles are
    the target's own, so that the service needs no cast (``launcher.targets.chosen``).

    What a target may do beyond these methods (pick the rendezvous port, a dry run on the scheduler,
    cancel one run of a sweep, read the ranks' stacks) are the small protocols of
    ``launcher.targets.capabilities``: a target has one by defining its method.

    Class attributes:
        name: the name its plugin is registered under (``launcher.core.plugins``).
        passes_host_env: the job's processes inherit the submitting process's environment, so the
            spec's ``env_from_host`` names reach them without their values being stored; targets
            without it refuse ``env_from_host``.
        metrics_elsewhere: why this machine cannot read the runs' metrics files (they write them
            where it cannot reach: in pods); None where it can.
    """

    name: ClassVar[str]
    passes_host_env: ClassVar[bool] = False
    metrics_elsewhere: ClassVar[str | None] = None

    def preflight(self, loaded: LoadedSpec, ctx: PlanContext) -> list[Issue]:
        """Problems found on this machine before submitting (a missing script, ...), as spec
        ``Issue``s; ``submit --no-preflight`` skips this. Default: nothing to check."""
        return []

    def inputs(self, loaded: LoadedSpec, *, online: bool) -> object:
        """What ``plan`` needs from outside ddpjob, read once before planning and passed in
        ``PlanContext.inputs`` (e.g. a scheduler's schema). ``online``: submitting, so the
        scheduler may be asked; offline (render, validate, --dry-run) only local copies are used."""
        return None

    def runs_image(self, spec: JobSpec) -> bool:
        """Whether the job runs in ``spec.image`` here, so that ``build:`` makes that image. Default: no."""
        return False

    @abc.abstractmethod
    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan[PayloadT]:
        """Build the request. Pure; raises ``SpecError`` (via ``loaded.error``) for target-specific problems."""

    @abc.abstractmethod
    def owns(self, plan: Plan[object]) -> TypeGuard[Plan[PayloadT]]:
        """Whether ``plan`` is this target's (its payload is this target's payload type)."""

    @abc.abstractmethod
    def load_handle(self, data: dict[str, object]) -> HandleT:
        """The handle stored in the registry as JSON, back as this target's dataclass
        (``launcher.targets.shared.files.from_json``)."""

    @abc.abstractmethod
    def submit(self, plan: Plan[PayloadT]) -> HandleT:
        """Hand ``plan`` to the scheduler; return the handle stored in the registry."""

    @abc.abstractmethod
    def status(self, handle: HandleT) -> JobStatus:
        """Current state, per task and node, with the root cause of a failure when known."""

    def recorded_status(self, handle: HandleT, state: JobState, message: str, why: str) -> JobStatus:
        """A finished job's status when its scheduler cannot be asked (``why``): the state and root
        cause ddpjob recorded when it ended, and what this machine's files still say of its runs."""
        return JobStatus(state, message, [], source=f"ddpjob's record; {why}")

    @abc.abstractmethod
    def logs(self, handle: HandleT, flt: LogFilter, follow: bool = False) -> Iterator[str]:
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
    def cancel(self, handle: HandleT) -> None:
        """Stop the job and everything it started. Safe to repeat; a finished job is left as it is."""

    def still_held(self, handle: HandleT) -> bool:
        """Whether the scheduler still holds resources for this job (asked of the scheduler, whatever
        ddpjob last recorded): ``cancel`` of an ended job frees them. Targets that can tell override it."""
        return False

    def cancel_note(self, handle: HandleT) -> str | None:
        """What ``cancel`` could not do on this machine, said after it (None: nothing)."""
        return None

    def status_many(self, handles: dict[str, HandleT]) -> dict[str, JobStatus]:
        """Status of several jobs (``ddpjob list``). Targets with a batch query override this
        to ask once for all jobs instead of once per job."""
        return {job_id: self.status(h) for job_id, h in handles.items()}

    def metrics_files(self, handle: HandleT) -> list[str]:
        """Each run's metrics file (``$DDPJOB_METRICS_FILE``, see ``launcher.core.progress``) where this
        machine can read it: from the output folders in the job's ``plan.json``. Targets whose runs
        write elsewhere (in pods) return []."""
        from launcher.core.progress import metrics_path
        from launcher.targets.shared.planrecord import read_plan_record

        plan = read_plan_record(handle.run_dir)
        return [metrics_path(folder) for folder in plan.metrics_dirs()] if plan is not None else []

    def progress(self, handle: HandleT) -> Progress | None:
        """How far the job is (``launcher.core.progress``): the latest run whose metrics file this
        machine can read and that reports steps (``task`` says which, for a sweep). None while a
        later run has started and reports no step yet, once that one has reached its last step: the
        run that trains now has no progress to show, not its predecessor's "step 16/16, ETA 0s"."""
        import os

        from launcher.core.progress import read_progress

        files = self.metrics_files(handle)
        found = [(i, p) for i, f in enumerate(files) if (p := read_progress(f)) is not None]
        if not found:
            return None
        index, progress = found[-1]
        if len(files) == 1:
            return progress
        total = progress.total_steps
        if not isinstance(total, int) or progress.step >= total:  # it may have ended: has a later run started?
            started = [i for i, nodes in enumerate(self.startup_files(handle)) if any(os.path.exists(log) for log, _ in nodes)]
            if started and started[-1] > index:
                return None
        return progress.of_task(index)

    def watch_files(self, handle: HandleT) -> list[str]:
        """Each run's ``watch.json`` (``launcher.targets.shared.heartbeat``) where this machine can read
        it: beside each run's node logs in the job's ``plan.json`` (the local target's)."""
        import os

        from launcher.targets.shared.runfolder import TaskFolder

        return [TaskFolder(os.path.dirname(files[0][0])).watch for files in self.startup_files(handle) if files]

    def health(self, handle: HandleT) -> JobHealth | None:
        """Every rank's health (``launcher.targets.shared.health.JobHealth``) of the latest run whose
        watch this machine can read: its last sample once the run has ended, each node that has ended
        saying how (the local node wrapper's exit record beside its log); None when there is none."""
        from launcher.targets.shared.health import exit_records, parse

        files, logs = self.watch_files(handle), self.startup_files(handle)
        for index in reversed(range(len(files))):
            state = read_json(files[index])
            if isinstance(state, dict):
                return parse(state, index, ends=exit_records(logs[index] if index < len(logs) else []))
        return None

    def stage(self, handle: HandleT, status: JobStatus) -> str:
        """One line for a live display while the job starts: where it is (waiting in a queue, nodes
        starting, rendezvous, workers running), else the status message."""
        from launcher.targets.shared.stage import startup_stage

        found = startup_stage(self.startup_files(handle)) if status.state is JobState.RUNNING else None
        return found or status.message or status.state.value.lower()

    def startup_files(self, handle: HandleT) -> list[list[tuple[str, str]]]:
        """Per run, per node: (its log, its torchrun log folder) where this machine can read them,
        from ``plan.json`` (the local target's nodes name both); [] where they cannot be read."""
        from launcher.targets.shared.planrecord import read_plan_record

        plan = read_plan_record(handle.run_dir)
        return plan.startup_files() if plan is not None else []
