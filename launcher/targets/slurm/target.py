"""Slurm target: one sbatch job (a job array for a sweep) submitted through submitit.

Each run is a multi-node allocation with one Slurm task per node; each task runs
``launcher.targets.slurm.job.node.NodeRunner`` (unpickled by submitit), which starts torchrun with
``--nnodes N --node-rank $SLURM_NODEID`` and the rendezvous resolved inside the job. See
``script`` for the job layout on disk and how render == submit is kept.

The handle (``SlurmHandle``, stored in the registry) holds the Slurm job id, the job dir and the
shape of the job (runs, nodes, processes per node, each run's parameters).

Native ids: ``123`` for a single job, ``123_<i>`` for run ``i`` of an array.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeGuard

from launcher.core.errors import Issue, SubmitRejected, TargetError, TargetUnavailable
from launcher.core.quantity import parse_memory, slurm_mem
from launcher.targets.base import LogFilter, Plan, PlanContext, Target
from launcher.targets.jobstatus import JobStatus
from launcher.targets.shared.files import atomic_write, from_json, mask_env_values, to_json
from launcher.targets.shared.launch import worker_command
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm.options import DEFAULT_FOLDER, SlurmOptions
from launcher.targets.slurm.payload import (
    PORT_SETUP,
    SlurmCommon,
    SlurmElement,
    SlurmHandle,
    SlurmPayload,
    node_paths,
    render_plan,
    resolve_folder,
    sbatch_script,
)

if TYPE_CHECKING:
    from launcher.core.states import JobState
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.shared.stacks import JobStacks
    from launcher.targets.slurm.container import ContainerInputs, Launch

NCCL_DEFAULTS = {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"}  # HPC fabrics usually have InfiniBand


class SlurmTarget(Target[SlurmPayload, SlurmHandle]):
    """Runs jobs on a Slurm cluster through submitit (``pip install 'ddpjob[slurm]'``)."""

    name = "slurm"
    passes_host_env = True  # sbatch exports the submitting environment (ddpjob refuses sbatch.export)

    # ------------------------------------------------------------------ plan

    def preflight(self, loaded: LoadedSpec, ctx: PlanContext) -> list[Issue]:
        """The script from the working directory, assuming (as Slurm jobs usually do) that it is on
        a filesystem the nodes share; modules only when the nodes run this machine's Python."""
        from launcher.targets.shared.preflight import missing_program

        spec = loaded.spec
        return missing_program(spec.command, spec.workdir or ctx.cwd,
                               check_modules=spec.section(SlurmOptions).container.runtime == "none")

    def runs_image(self, spec: JobSpec) -> bool:
        """oci and podman run the spec's image from the submitting machine's engine (build: makes it);
        pyxis and apptainer name images their own way, and slurm.container.image or bundle wins."""
        c = spec.section(SlurmOptions).container
        return c.runtime in ("oci", "podman") and c.image is None and c.bundle is None

    def owns(self, plan: Plan[object]) -> TypeGuard[Plan[SlurmPayload]]:
        return isinstance(plan.payload, SlurmPayload)

    def load_handle(self, data: dict[str, object]) -> SlurmHandle:
        return from_json(SlurmHandle, data)

    def inputs(self, loaded: LoadedSpec, *, online: bool) -> ContainerInputs | None:
        """oci and podman: the submitting user's ids; oci: the image's id and environment too."""
        from launcher.targets.slurm.container import read_inputs

        return read_inputs(loaded, online=online)

    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan[SlurmPayload]:
        # Imported here: status, logs and cancel never load the spec's models.
        from launcher.spec.sweep import expand
        from launcher.targets.shared import dist
        from launcher.targets.slurm.container import launch as container_launch

        spec, s = loaded.spec, loaded.spec.section(SlurmOptions)
        gpus = s.gpus_per_node if s.gpus_per_node is not None else spec.resources.gpus
        cpus = s.cpus_per_task or spec.resources.cpus
        procs_per_node = dist.resolve_procs_per_node(spec, gpus)
        # The default folder follows $DDPJOB_HOME where it is set, as the registry and run folders do.
        where = f"{ctx.ddpjob_home.rstrip('/')}/slurm" if ctx.ddpjob_home and s.folder == DEFAULT_FOLDER else s.folder
        folder = resolve_folder(where, ctx.home, ctx.cwd)
        job_dir = f"{folder}/{ctx.job_id}"
        workdir = spec.workdir or ctx.cwd
        output_root = spec.output_dir or RunFolder(job_dir).output
        if not os.path.isabs(output_root):
            output_root = os.path.normpath(os.path.join(workdir, output_root))
        runs = expand(spec, job_id=ctx.job_id, output_root=output_root)
        array = bool(spec.sweep)
        launch = container_launch(loaded, ctx, folder=folder, job_dir=job_dir, workdir=workdir,
                                  output_dirs=[output_root], gpus=gpus, array=array)
        params = _executor_params(spec, ctx.job_id, gpus=gpus, cpus=cpus, runs=len(runs) if array else None,
                                  srun_args=launch.srun_args)
        map_count = len(runs) if array else None
        script = sbatch_script(params, job_dir=job_dir, python=launch.submit_python, map_count=map_count)
        common = SlurmCommon(
            job_id=ctx.job_id, job_dir=job_dir, nodes=spec.nodes, procs_per_node=procs_per_node,
            python=launch.python, submit_python=launch.submit_python, workdir=workdir,
            max_restarts=spec.max_restarts, master_port=spec.master_port, requeue=s.requeue,
            signal_delay_s=s.signal_delay_s, max_timeouts=s.max_timeouts,
            env=dist.process_env(spec, NCCL_DEFAULTS, cpus_per_node=cpus, procs_per_node=procs_per_node),
            stall_timeout_s=spec.stall.timeout_s, stall_action=spec.stall.action,
            max_losses=spec.recovery.max_losses if spec.nodes > 1 else 0, min_nodes=spec.recovery.min_nodes,
            lost_after_s=spec.recovery.lost_after,
        )
        elements = [SlurmElement(el.index, el.params, el.output_dir, el.env, worker_command(el.command, launch.python))
                    for el in runs]
        submission_file = RunFolder(job_dir).submission_script("<SLURM_ARRAY_JOB_ID>" if array else "<SLURM_JOB_ID>")
        payload = SlurmPayload(common, elements, params, map_count, script, ctx.run_dir, submission_file,
                               launch.files, launch.oci, _container_text(launch))
        return Plan("slurm", ctx.job_id, spec.name, ctx.run_dir, payload, render_plan, spec.nodes, procs_per_node,
                    len(elements), spec.master_port)

    # ------------------------------------------------------------------ submit

    def submit(self, plan: Plan[SlurmPayload]) -> SlurmHandle:
        try:
            from launcher.targets.slurm import submit as slurm_submit
        except ModuleNotFoundError as e:
            if e.name == "submitit" or (e.name or "").startswith("submitit."):
                raise TargetUnavailable("the slurm target needs submitit: pip install 'ddpjob[slurm]'") from e
            raise
        p: SlurmPayload = plan.payload
        os.makedirs(plan.run_dir, exist_ok=True)
        # A record only (the job runs from submitit's pickle): secret values stay out of it.
        RunFolder(plan.run_dir).write_plan(mask_env_values(to_json(p), plan.masked), plan.render())
        _prepare_container(p)
        try:
            slurm_id, script_path = slurm_submit.submit(p)
        except slurm_submit.RenderMismatch as e:
            raise SubmitRejected(f"nothing was submitted: {e}") from e
        except RuntimeError as e:
            # submitit raises RuntimeError without srun on PATH and FailedJobError (a RuntimeError)
            # when sbatch refuses the job; the message carries sbatch's own words.
            if "srun" in str(e) and "slurm cluster" in str(e):
                raise TargetUnavailable("no Slurm here: srun is not on PATH") from e
            raise SubmitRejected(f"sbatch refused the job: {str(e).strip()}") from e
        c = p.common
        return SlurmHandle(
            job_id=plan.job_id, run_dir=plan.run_dir, slurm_job_id=slurm_id, array=p.map_count is not None,
            runs=len(p.elements), nodes=c.nodes, procs_per_node=c.procs_per_node, job_dir=c.job_dir,
            submission_file=script_path, params=[el.params for el in p.elements],
            container=f"oci bundle {p.oci.path}" if p.oci else "")

    # ------------------------------------------------------------------ status

    def status(self, handle: SlurmHandle) -> JobStatus:
        return self.status_many({"_": handle})["_"]

    def status_many(self, handles: dict[str, SlurmHandle]) -> dict[str, JobStatus]:
        from launcher.targets.slurm import query as slurm_query
        from launcher.targets.slurm.status import job_status

        records = slurm_query.query([h.slurm_job_id for h in handles.values()],
                                    elements={h.slurm_job_id: h.runs for h in handles.values() if h.array})
        return {job_id: job_status(h, records) for job_id, h in handles.items()}

    def recorded_status(self, handle: SlurmHandle, state: JobState, message: str, why: str) -> JobStatus:
        from launcher.targets.slurm.status import recorded_status

        return recorded_status(handle, state, message, why)

    def watch_files(self, handle: SlurmHandle) -> list[str]:
        """Each run's ``watch.json``, written by its first node's runner (``slurm/job/node.py``)."""
        return [node_paths(handle.job_dir, index, 0)["watch"] for index in range(handle.runs)]

    def startup_files(self, handle: SlurmHandle) -> list[list[tuple[str, str]]]:
        paths = [[node_paths(handle.job_dir, i, n) for n in range(handle.nodes)] for i in range(handle.runs)]
        return [[(p["log"], p["torchrun_log_dir"]) for p in run] for run in paths]

    def stacks(self, handle: SlurmHandle, flt: LogFilter) -> JobStacks:
        from launcher.targets.slurm.status import ask_stacks
        return ask_stacks(handle, flt)  # each node's runner answers through the shared job folder

    def stage(self, handle: SlurmHandle, status: JobStatus) -> str:
        """Pending: Slurm's reason and the job's place among the pending jobs, in priority order."""
        from launcher.core.states import JobState
        from launcher.targets.slurm.query import queue_position

        text = super().stage(handle, status)
        if status.state is JobState.PENDING and handle.slurm_job_id:
            place = queue_position(handle.slurm_job_id)
            if place is not None:
                text += f" ({place[0]} of {place[1]} pending job(s) in priority order)"
        return text

    # ------------------------------------------------------------------ logs

    def logs(self, handle: SlurmHandle, flt: LogFilter, follow: bool = False) -> Iterator[str]:
        """Lines of each run's node logs (``<job dir>/task-<i>/node-<n>.log``), prefixed with task,
        node and rank.

        1. Without ``follow``: what the log files hold now, then stop; a run that has not started
           (still pending) has no files and yields nothing.
        2. With ``follow``: existing lines, then new ones; files that do not exist yet (pending
           runs of an array, nodes still starting) are waited for. Stops once Slurm reports the job
           terminal and every file is drained. Slurm is asked at most every few seconds (backing
           off to 10 s), never once per poll of the files.
        3. ``tail=N``: the last N lines of each file before following (of those shown: torchrun's own
           tracebacks and log records are hidden unless ``verbose``, see ``logtail.AgentNoise``).
        4. ``task``/``node``/``rank`` select one run, node or global rank; an unknown task is an error.
        5. A requeued run appends to the same files; a ``[ddpjob] ... start K`` line marks each start.
        """
        from launcher.targets.shared.logtail import LogSource, follow_files
        from launcher.targets.slurm.status import node_records

        runs = handle.runs
        if flt.task is not None and not 0 <= flt.task < runs:
            raise TargetError(f"task {flt.task} does not exist (this job has {runs} task(s): 0..{runs - 1})")
        srcs = []
        for index in range(runs):
            if flt.task is not None and index != flt.task:
                continue
            for node in range(handle.nodes):
                if flt.node is not None and node != flt.node:
                    continue
                label = (f"task{index} " if runs > 1 else "") + f"node{node}"
                srcs.append(LogSource(node_paths(handle.job_dir, index, node)["log"], label, node,
                                      handle.procs_per_node, index))
        polite = _polite(lambda: self.status(handle).state.terminal)
        quick = _polite(lambda: self.status(handle).state.terminal, first=0.5, factor=1.0, most=0.5)

        def finished() -> bool:
            # Once every node's runner has recorded its end (cheap file reads), ask Slurm often:
            # the job is about to end, and following should not wait out a long polling interval.
            if all(len(recs := node_records(handle, i)) == handle.nodes and
                   all(r.get("state") == "exited" for r in recs) for i in range(handle.runs)):
                return quick()
            return polite()

        yield from follow_files(srcs, tail=flt.tail, rank=flt.rank, follow=follow, finished=finished, poll=0.2,
                                verbose=flt.verbose)

    # ------------------------------------------------------------------ cancel

    def cancel(self, handle: SlurmHandle) -> None:
        self._cancel(handle, None)

    def still_held(self, handle: SlurmHandle) -> bool:
        """Whether the controller still lists the job pending or running (not merely completing:
        scancel cannot hurry a node Slurm cannot reach)."""
        from launcher.targets.slurm import query as slurm_query

        proc = slurm_query._run(["squeue", "-h", "-r", "-o", "%T", "-j", handle.slurm_job_id],
                                slurm_query.COMMAND_TIMEOUT_S)
        if proc is None or proc.returncode != 0:
            return False
        return any(slurm_query.held(word) for word in proc.stdout.split())

    def cancel_task(self, handle: SlurmHandle, index: int) -> None:
        """Cancel one run of an array (``scancel <id>_<index>``); the other runs go on."""
        if not handle.array or not 0 <= index < handle.runs:
            raise TargetError(f"task {index} does not exist (this job has {handle.runs} task(s))")
        self._cancel(handle, index)

    def _cancel(self, handle: SlurmHandle, index: int | None) -> None:
        from launcher.targets.slurm import query as slurm_query

        jid = handle.slurm_job_id + (f"_{index}" if index is not None else "")
        proc = slurm_query._run(["scancel", jid], slurm_query.COMMAND_TIMEOUT_S)
        if proc is None:
            raise TargetError(f"scancel {jid} timed out; the controller may be overloaded, try again")
        if proc.returncode != 0 and "already completing or completed" not in proc.stderr \
                and "Invalid job id" not in proc.stderr:
            raise TargetError(f"scancel {jid} failed: {proc.stderr.strip()}")
        # Wait (politely) until Slurm reports the cancellation, so status right after says so.
        deadline = time.monotonic() + 30
        delay = 0.3
        while time.monotonic() < deadline:
            st = self.status(handle)
            states = [t.state for t in st.tasks if index is None or t.index == index]
            if states and all(s.terminal for s in states):
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 3.0)


def _container_text(launch: Launch) -> list[str]:
    """What render adds for the oci and podman runtimes: the bundle and its config.json, or the task epilog."""
    from launcher.targets.slurm.container import UNKNOWN_ID

    b = launch.oci
    out: list[str] = []
    if b is not None and b.image is None:
        out = [f"#### OCI bundle: {b.path} (named by slurm.container.bundle, used as it is)", ""]
    elif b is not None:
        unknown = " (the image could not be inspected here: id and PATH are placeholders)" if UNKNOWN_ID in b.path else ""
        out = [f"#### OCI bundle: {b.path}{unknown}",
               f"# made at submit from image {b.image} (id {b.image_id}): its files once under {b.base}/rootfs,",
               "# hard-linked into the bundle's rootfs/ beside this config.json (Slurm adds the task's command and",
               "# environment); reused by every job with the same image and config.json",
               _bundles_line(os.path.dirname(b.path)),
               *b.config.rstrip("\n").splitlines(), "#### end of config.json", ""]
    for path, text in launch.files.items():
        out += [f"#### file written before sbatch: {path}", *text.rstrip("\n").splitlines(), "#### end of file", ""]
    return out


def _bundles_line(oci_dir: str) -> str:
    from launcher.targets.slurm import bundles

    count, size = bundles.usage(oci_dir)
    return (f"# {oci_dir} holds {count} bundle(s), {size / 2**20:.0f} MiB on disk (files shared by hard links "
            f"counted once); each submit removes bundles unused for {bundles.KEEP_S / 86400:.0f} days that no job "
            "in the queue uses")


def _prepare_container(p: SlurmPayload) -> None:
    """Before sbatch: files the job needs (podman's task epilog) and the OCI bundle (made once)."""
    from launcher.targets.slurm.container import prepare_bundle

    for path, text in p.files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, text)
        os.chmod(path, 0o700)
    if p.oci is not None:
        try:
            prepare_bundle(p.oci)
        except (OSError, RuntimeError) as e:
            raise TargetUnavailable(f"nothing was submitted: could not make the OCI bundle {p.oci.path} from "
                                    f"image {p.oci.image}: {e}") from e
        if p.oci.image is not None:  # one ddpjob made: stamp it used, then remove the unused ones
            from launcher.targets.slurm import bundles

            bundles.stamp(p.oci.path)
            bundles.stamp(p.oci.base)
            bundles.prune(os.path.dirname(p.oci.path))


def _executor_params(spec: JobSpec, job_id: str, *, gpus: int, cpus: int | None, runs: int | None,
                     srun_args: list[str]) -> dict[str, object]:
    """submitit's ``SlurmExecutor`` parameters (and so the sbatch flags) for the job."""
    from launcher.targets.slurm.options import time_to_minutes

    s = spec.section(SlurmOptions)
    memory = s.memory or spec.resources.memory
    if s.memory:
        mem: str | None = slurm_mem(parse_memory(s.memory, "sbatch"))
    else:
        mem = slurm_mem(parse_memory(memory, "quantity")) if memory else None
    additional: dict[str, object] = {"requeue" if s.requeue else "no-requeue": True}
    if spec.nodes > 1 and spec.recovery.max_losses:
        # The run goes on without a lost node (job/recover.py): when Slurm declares that node down it must
        # end neither the job (sbatch --no-kill) nor the step's tasks on the other nodes (srun --no-kill:
        # the batch host's loss included, where srun itself is lost). A task that exits non-zero still
        # ends the step (--kill-on-bad-exit holds with srun --no-kill: checked on the private cluster).
        additional["no-kill"] = True
        srun_args = ["--no-kill", *srun_args]
    additional.update(s.sbatch)
    params: dict[str, object] = {
        "job_name": job_id,
        "nodes": spec.nodes,
        "ntasks_per_node": 1,
        "time": time_to_minutes(str(s.time)),
        "signal_delay_s": s.signal_delay_s,
        "wckey": None,
        "additional_parameters": additional,
    }
    optional = {
        "partition": s.partition, "account": s.account, "qos": s.qos, "constraint": s.constraint,
        "cpus_per_task": cpus, "gpus_per_node": gpus or None, "mem": mem,
        "exclusive": True if s.exclusive else None,
        "setup": [*s.setup, *([] if spec.master_port else PORT_SETUP)] or None,
        "srun_args": srun_args,
        "array_parallelism": (s.array_parallelism or runs) if runs is not None else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def _polite(fn: Callable[[], bool], first: float = 1.0, factor: float = 1.5, most: float = 10.0) -> Callable[[], bool]:
    """``fn`` called at most once per interval (growing from ``first`` to ``most``); cached in between."""
    state = {"next": 0.0, "delay": first, "value": False}

    def wrapper() -> bool:
        now = time.monotonic()
        if state["value"] or now < state["next"]:
            return bool(state["value"])
        state["value"] = fn()
        state["next"] = now + state["delay"]
        state["delay"] = min(state["delay"] * factor, most)
        return bool(state["value"])

    return wrapper
