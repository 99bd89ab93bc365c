"""The service layer: the one path from a spec to a running job and back, for every entry point.

The CLI (``launcher.cli.main``) parses arguments, calls ``Jobs`` and prints; the Python API uses the
same class. One submit walks, in this order::

    load spec -> build: (pin the image) -> target inputs -> reserve id (and a port) -> plan ONCE -> submit -> record

A plan that fails after the reservation releases it (nothing was submitted, nothing is listed).
``render`` and ``submit --dry-run`` plan the same way with a placeholder id (``<name>-xxxxx``)
and no port: where a value is only known at submit, the plan says so instead of inventing one.

``status``, ``list_jobs``, ``wait``, ``logs`` and ``cancel`` work from the registry, so any later
shell (or process) can follow a job. Library code here raises typed errors and never prints.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core.errors import (
    DdpjobError,
    NotSubmitted,
    SpecError,
    SubmitRejected,
    TargetUnavailable,
    UsageError,
    WaitTimeout,
)
from launcher.core.interrupts import deferred_interrupt
from launcher.core.states import JobState
from launcher.service.loading import load as load  # the service's way in: a spec file or a command
from launcher.service.shape import check_count, check_selection, check_timeout, plan_shape

if TYPE_CHECKING:
    from launcher.core.progress import Progress
    from launcher.service.imagebuild.pin import Resolved
    from launcher.service.registry import JobRecord, Registry
    from launcher.spec.load import LoadedSpec
    from launcher.targets.base import Handle, LogFilter, Plan, PlanContext
    from launcher.targets.chosen import Bound, Chosen
    from launcher.targets.jobstatus import JobStatus
    from launcher.targets.shared.health import JobHealth
    from launcher.targets.shared.stacks import JobStacks

# A job without a handle this long after its reservation was abandoned by its submitting process.
ABANDONED_AFTER_S = 120.0


@dataclass
class Submission:
    """What ``Jobs.submit`` returns: the recorded id, the plan that was submitted and its handle."""

    job_id: str
    plan: Plan[object]
    handle: Handle
    # Lines for the person submitting (on stderr): what the build left out of the image as secret-looking.
    notices: tuple[str, ...] = ()


class SubmitInterrupted(KeyboardInterrupt):
    """Ctrl-C arrived while the job was handed over; it was submitted and recorded all the same."""

    def __init__(self, submission: Submission) -> None:
        super().__init__(submission.job_id)
        self.submission = submission


class Cancelled(enum.Enum):
    """What ``Jobs.cancel`` did."""

    CANCELLED = "cancelled"
    TASK_CANCELLED = "task cancelled"
    ALREADY_ENDED = "already ended"
    RELEASED = "ended, its allocation freed"


def gpu_count() -> int:
    """GPUs on this machine without importing torch: the NVIDIA device nodes, honouring CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    try:
        return len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])
    except OSError:
        return 0


class Jobs:
    """Submit, inspect, follow and stop jobs; the registry remembers them between calls.

    Args:
        registry: where jobs are recorded (default: ``$DDPJOB_HOME``, else ``~/.ddpjob``).
    """

    def __init__(self, registry: Registry | None = None) -> None:
        if registry is None:
            from launcher.service.registry import Registry

            registry = Registry()
        self.registry = registry

    # ------------------------------------------------------------------ plan and submit

    def context(self, job_id: str, port: int | None = None, inputs: object = None) -> PlanContext:
        """What a plan may depend on besides the spec, read from this machine once."""
        from launcher.targets.base import PlanContext

        return PlanContext(
            job_id=job_id, run_dir=str(self.registry.runs_dir() / job_id), port=port,
            cpu_count=os.cpu_count() or 1, gpu_count=gpu_count(), home=os.path.expanduser("~"),
            cwd=os.getcwd(), python=sys.executable, inputs=inputs,
            port_command=(sys.executable, "-m", "launcher.service.ports", str(self.registry.home), job_id)
            if port is not None else (),
            ddpjob_home=str(self.registry.home) if os.environ.get("DDPJOB_HOME") else None,
        )

    def plan(self, loaded: LoadedSpec, target: str, *, online: bool = False) -> Plan[object]:
        """The plan ``submit`` would make, with a placeholder id and no port: submits nothing and
        asks no scheduler (the target's inputs come from local copies only), unless ``online``
        (``--dry-run=server``: the inputs come from the scheduler, as on submit)."""
        from launcher.targets.lookup import get_target

        tgt = get_target(target)
        pinned = _pinned(tgt, loaded, build=False)  # build: looked up, never built
        loaded = pinned.loaded if pinned else loaded
        ctx = self.context(f"{loaded.spec.name}-xxxxx", inputs=tgt.inputs(loaded, online=online))
        return _noted(self._plan(tgt, loaded, ctx, submitting=False), pinned)

    def _plan(self, tgt: Chosen, loaded: LoadedSpec, ctx: PlanContext, *, submitting: bool) -> Plan[object]:
        """The target's plan, with the text people see (and ``plan.txt`` holds): secret values
        masked, ``env_from_host`` names listed (``launcher.service.shown``)."""
        from launcher.service import shown as secretenv
        from launcher.spec.size import work_issue

        issues = secretenv.host_env_issues(tgt, loaded, submitting=submitting)
        if issues:
            raise loaded.error(issues)
        plan = tgt.plan(loaded, ctx)
        too_big = work_issue(plan.nodes, plan.procs_per_node, plan.runs)  # procs_per_node: auto, now known
        if too_big:
            raise loaded.error([too_big])
        return secretenv.shown_plan(loaded, plan)

    def server_dry_run(self, plan: Plan[object]) -> str:
        """Ask the scheduler to check ``plan`` without creating anything (Kubernetes: dryRun=All)."""
        from launcher.targets.lookup import get_target

        return get_target(plan.target).server_dry_run(plan)

    def check_server_dry_run(self, target: str) -> None:
        """``UsageError`` when ``target`` has no server to ask (``--dry-run=server``), before anything is
        planned or printed: a client dry run in its place would pass for the server's verdict."""
        from launcher.core.errors import UsageError
        from launcher.targets.capabilities import DryRunsOnServer
        from launcher.targets.lookup import target_class

        if not issubclass(target_class(target), DryRunsOnServer):
            raise UsageError(f"--dry-run=server asks a cluster's API server, and the {target} target has none: "
                             "use --dry-run (what would be submitted, checked here)")

    def submit(self, loaded: LoadedSpec, target: str, *, preflight: bool = True) -> Submission:
        """Check, reserve, plan once, submit and record.

        A spec error, or a target that is unavailable or refuses the job, leaves nothing behind
        (it was never submitted); any other failure during the hand-over is recorded as a FAILED
        job with the reason. Ctrl-C between reservation and record is held until the job is
        recorded, then raised as ``SubmitInterrupted`` carrying the submission.

        Args:
            preflight: first check on this machine what the target can (a missing script).
        """
        from launcher.service import notifier, origin
        from launcher.targets.lookup import get_target

        tgt, spec = get_target(target), loaded.spec
        if preflight:
            issues = tgt.preflight(loaded, self.context(f"{spec.name}-xxxxx"))
            if issues:
                raise loaded.error(issues)
        pinned = _pinned(tgt, loaded, build=True)  # build:, push, pin the digest
        loaded = pinned.loaded if pinned else loaded
        inputs = tgt.inputs(loaded, online=True)  # before the reservation: a refusal leaves no trace
        picker = tgt.pick_port if tgt.picks_port and spec.master_port is None else None
        fixed = spec.master_port if tgt.picks_port else None
        with deferred_interrupt() as interrupted:
            job_id, port = self.registry.reserve(spec.name, target, loaded.spec.model_dump(mode="json"), port=fixed,
                                                 port_picker=picker, origin=origin.origin_of(loaded))
            try:
                plan = _noted(self._plan(tgt, loaded, self.context(job_id, port, inputs), submitting=True), pinned)
                handle = tgt.submit(plan)
            except (SpecError, TargetUnavailable, SubmitRejected):
                self._release(job_id)  # nothing was submitted: not a job, nothing to list
                raise
            except BaseException as e:
                self.registry.update_state(job_id, JobState.FAILED, f"submit failed: {e}")
                raise
            self.registry.record_handle(job_id, handle.to_json(), shape=plan_shape(plan))
            done = Submission(job_id, plan, handle, pinned.notices if pinned else ())
            if spec.notify is not None:  # a watcher sends it when the job ends (service/notifier.py)
                notifier.start(str(self.registry.home), job_id, plan.run_dir, spec.notify)
        if interrupted:
            raise SubmitInterrupted(done)
        return done

    def _release(self, job_id: str) -> None:
        import shutil

        self.registry.release(job_id)
        shutil.rmtree(self.registry.runs_dir() / job_id, ignore_errors=True)

    # ------------------------------------------------------------------ inspect

    def get(self, job_id: str) -> JobRecord:
        """The registry's record (a unique prefix of the id is enough); ``JobNotFound`` otherwise."""
        return self.registry.get(job_id)

    def refresh(self, job_id: str) -> tuple[JobRecord, JobStatus | None]:
        """Ask the target for the job's status and store it; terminal records are final."""
        from launcher.targets.jobstatus import JobStatus

        rec = self.registry.get(job_id)
        if rec.handle is None:
            if rec.state.terminal:
                return rec, None
            msg = "submission did not complete: no handle was recorded"
            if time.time() - rec.created_at > ABANDONED_AFTER_S:
                self.registry.update_state(rec.id, JobState.FAILED, msg + " (the submitting process stopped)")
                return self.registry.get(rec.id), None
            return rec, JobStatus(JobState.PENDING, "being submitted")
        job = self.bound(rec)
        try:
            st = job.status()
        except TargetUnavailable as e:
            if not rec.state.terminal:  # a job that may still run: its state is unknown from here
                raise
            # What ddpjob recorded when the job ended stays true whether or not its scheduler answers now.
            st = job.recorded_status(rec.state, rec.message, str(e).split(";")[0])
        st = st.scrubbed(rec.scrub)  # the job's secret values and any credential it printed never shown
        if not rec.state.terminal:
            started, ended = st.span()  # the target's own times: a job's end is when it ended, not when seen
            rec = self.registry.note_state(rec, st.state, st.message, started=started, ended=ended)
        return rec, st

    def recorded(self, *, limit: int = 200) -> list[JobRecord]:
        """Jobs as last recorded, newest first, asking no target (shell completion)."""
        return self.registry.list(limit=limit)

    def list_jobs(self, *, limit: int | None = 50, target: str | None = None) -> list[JobRecord]:
        """Jobs, newest first; unfinished ones are refreshed with one batched query per target.
        A target out of reach leaves its jobs as last known (``launcher.service.queue``)."""
        from launcher.service.queue import queue

        return [entry.rec for entry in queue(self.registry, limit=limit, target=target)]

    def progress(self, rec: JobRecord) -> Progress | None:
        """How far the job is (``launcher.core.progress``), as its target can tell: from a run's
        metrics file read here (local, Slurm), from the pods' logs (Kubernetes). A job still PENDING
        has none, and its target is not asked (``list`` stays one query per target). A job that has
        ended has no ETA (a run that ended early would show the time its last rate gave it)."""
        if rec.handle is None or rec.state is JobState.PENDING:
            return None
        progress = self.bound(rec).progress()
        if progress is not None and rec.state.terminal and progress.eta_s is not None:
            import dataclasses

            progress = dataclasses.replace(progress, eta_s=None)
        return progress

    def health(self, rec: JobRecord) -> JobHealth | None:
        """Every rank's health (``launcher.targets.shared.health.JobHealth``) as its target can tell,
        the last sample of a job that ended; None before the first sample, or where none is kept."""
        if rec.handle is None:
            return None
        return self.bound(rec).health()

    def stacks(self, job_id: str, flt: LogFilter) -> JobStacks:
        """Every live rank's Python stack (``flt``: which task, node, rank), read by py-spy."""
        rec = self.registry.get(job_id)
        check_selection(rec, task=flt.task, node=flt.node, rank=flt.rank)
        if rec.handle is None:
            raise NotSubmitted(f"{rec.id} has no ranks: its submission did not complete ({rec.message or rec.state.value})")
        return self.bound(rec).stacks(flt)

    def wait(self, job_id: str, timeout: float | None = None,
             on_poll: Callable[[JobRecord], None] | None = None) -> JobRecord:
        """Poll until the job ends (politely: backing off to one query every 5 s).

        Args:
            on_poll: called with the record after each poll of a running job (live progress).
        Raises:
            WaitTimeout: ``timeout`` seconds passed first; the job keeps running.
        """
        check_timeout(timeout)
        start, delay = time.monotonic(), 0.2
        while True:
            rec, _ = self.refresh(job_id)
            if rec.state.terminal:
                return rec
            if on_poll is not None:
                on_poll(rec)
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeout(f"{rec.id} is still {rec.state.value} after {timeout:g}s; it keeps running")
            time.sleep(delay if timeout is None else min(delay, max(0.0, timeout - elapsed)))
            delay = min(delay * 1.5, 5.0)

    def logs(self, job_id: str, flt: LogFilter, *, follow: bool = False) -> Iterator[str]:
        """The job's lines, prefixed with node and rank (see ``Target.logs`` for the rules)."""
        check_count("--tail", flt.tail)
        rec = self.registry.get(job_id)
        check_selection(rec, task=flt.task, node=flt.node, rank=flt.rank)
        if rec.handle is None:
            raise NotSubmitted(f"{rec.id} has no logs: its submission did not complete ({rec.message or rec.state.value})")
        for line in self.bound(rec).logs(flt, follow=follow):
            yield rec.scrub(line)  # the job's secret values and any credential it printed masked

    # ------------------------------------------------------------------ stop

    def cancel(self, job_id: str, task: int | None = None) -> Cancelled:
        """Stop the job (or one run of a sweep, ``task``) and everything it started. Safe to repeat."""
        rec = self.registry.get(job_id)
        check_selection(rec, task=task)
        if rec.state.terminal:
            return self._free_held(rec)
        if rec.handle is None:
            if task is not None:
                raise UsageError(f"{rec.id} has no tasks to cancel: its submission did not complete")
        else:
            rec, _ = self.refresh(rec.id)
            if rec.state.terminal:
                return self._free_held(rec)
            job = self.bound(rec)
            if task is not None:
                job.cancel_task(task)
                return Cancelled.TASK_CANCELLED
            job.cancel()
        self.registry.update_state(rec.id, JobState.CANCELLED, "cancelled by user")
        return Cancelled.CANCELLED

    def _free_held(self, rec: JobRecord) -> Cancelled:
        """An ended job whose scheduler still holds its allocation (a run ended by its stall watch
        while Slurm waits on a node): cancel it there; the recorded state stays as it is."""
        if rec.handle is None:
            return Cancelled.ALREADY_ENDED
        job = self.bound(rec)
        if not job.still_held():
            return Cancelled.ALREADY_ENDED
        job.cancel()
        return Cancelled.RELEASED

    def cancel_note(self, job_id: str) -> str | None:
        """The target's word on what ``cancel`` could not reach (local: no cgroups here)."""
        rec = self.registry.get(job_id)
        if rec.handle is None:
            return None
        return self.bound(rec).cancel_note()

    def native_ids(self, rec: JobRecord) -> list[str]:
        """The scheduler's own ids of a recorded job (the handle's ``native_ids``); [] before submit."""
        if rec.handle is None:
            return []
        try:
            return self.bound(rec).handle.native_ids()
        except (DdpjobError, TypeError, ValueError, KeyError):  # a target not installed here, an old record
            return []

    def bound(self, rec: JobRecord) -> Bound:
        """The recorded job with its target (``launcher.targets.chosen``); its handle read back by the target."""
        from launcher.targets.lookup import get_target

        if rec.handle is None:
            raise NotSubmitted(f"{rec.id}: its submission did not complete ({rec.message or rec.state.value})")
        return get_target(rec.target).bind(rec.handle)


def _pinned(tgt: Chosen, loaded: LoadedSpec, *, build: bool) -> Resolved | None:
    """``build:``'s image (``service/imagebuild``, loaded only for a spec that has one: ~10 ms)."""
    if loaded.spec.build is None:
        return None
    from launcher.service.imagebuild import pin

    return pin.for_target(tgt, loaded, build=build)


def _noted(plan: Plan[object], pinned: Resolved | None) -> Plan[object]:
    if pinned is None or not pinned.note:
        return plan
    from launcher.service.imagebuild import pin

    return pin.noted(plan, pinned.note)
