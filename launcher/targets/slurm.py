"""Slurm target: one sbatch job (a job array for a sweep) submitted through submitit.

Each run is a multi-node allocation with one Slurm task per node; each task runs
``launcher.targets.slurm_node.NodeRunner`` (unpickled by submitit), which starts torchrun with
``--nnodes N --node-rank $SLURM_NODEID`` and the rendezvous resolved inside the job. See
``slurm_script`` for the job layout on disk and how render == submit is kept.

Handle (JSON, stored in the registry)::

    {"slurm_job_id": "123", "array": true, "runs": 4, "nodes": 2, "procs_per_node": 1,
     "job_dir": "/home/u/.ddpjob/slurm/sweep-ab3cd", "submission_file": ".../123_submission.sh",
     "run_dir": "<registry run dir>", "job_id": "sweep-ab3cd", "params": [{"lr": "0.1"}, ...]}

Native ids: ``123`` for a single job, ``123_<i>`` for run ``i`` of an array.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from launcher import dist
from launcher.errors import Issue, SubmitRejected, TargetError, TargetUnavailable
from launcher.spec import expand
from launcher.spec_slurm import _IMAGE_RE, slurm_memory, time_to_minutes
from launcher.specload import LoadedSpec
from launcher.states import JobState, combine
from launcher.targets import slurm_query
from launcher.targets.base import JobStatus, LogFilter, Plan, PlanContext, Target, TaskStatus
from launcher.targets.logtail import LogSource, follow_files
from launcher.targets.rootcause import node_failure
from launcher.targets.slurm_script import node_paths, render_plan, resolve_folder, sbatch_script
from launcher.targets.torchrun import worker_command

class SlurmTarget(Target):
    """Runs jobs on a Slurm cluster through submitit (``pip install 'ddpjob[slurm]'``)."""

    name = "slurm"

    # ------------------------------------------------------------------ plan

    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan:
        spec = loaded.spec
        s = spec.slurm
        issues: list[Issue] = []
        runtime = s.container.runtime
        image = s.container.image or spec.image
        if runtime != "none":
            if image is None:
                issues.append(Issue(("slurm", "container", "image"), f"container runtime {runtime} needs an image",
                                    hint="set image: (top level) or slurm.container.image"))
            elif not _IMAGE_RE.match(image):
                issues.append(Issue(("image",), "must be an image reference or path without blanks or quotes"))
        if issues:
            raise loaded.error(issues)

        gpus = s.gpus_per_node if s.gpus_per_node is not None else spec.resources.gpus
        cpus = s.cpus_per_task or spec.resources.cpus
        memory = s.memory or spec.resources.memory
        procs_per_node = dist.resolve_procs_per_node(spec, gpus)
        folder = resolve_folder(s.folder, ctx.home, ctx.cwd)
        job_dir = f"{folder}/{ctx.job_id}"
        workdir = spec.workdir or ctx.cwd
        output_root = spec.output_dir or f"{job_dir}/output"
        if not os.path.isabs(output_root):
            output_root = os.path.normpath(os.path.join(workdir, output_root))

        # The interpreter that runs submitit (and torchrun) on the nodes.
        # --kill-on-bad-exit: when torchrun on one node fails, the run has failed; without it the
        # other nodes' agents wait out torchrun's exit barrier (5 minutes) before the job ends.
        srun_args = ["--kill-on-bad-exit=1"]
        if runtime == "none":
            python = ctx.python
            submit_python = shlex.quote(python)
        elif runtime == "pyxis":
            python = s.container.python
            submit_python = shlex.quote(python)
            mounts = _mounts([folder, workdir], s.container.mounts)
            srun_args += [f"--container-image={image}", f"--container-mounts={','.join(mounts)}",
                          f"--container-workdir={workdir}"]
        else:  # apptainer
            python = s.container.python
            binds: list[str] = []
            for m in _mounts([folder, workdir], s.container.mounts):
                binds += ["--bind", m]
            submit_python = shlex.join(["apptainer", "exec", "--nv", *binds, "--pwd", workdir, str(image), python])

        additional: dict[str, Any] = {"requeue" if s.requeue else "no-requeue": True}
        additional.update(s.sbatch)
        elements_spec = expand(spec, job_id=ctx.job_id, output_root=output_root)
        array = bool(spec.sweep)
        executor_params: dict[str, Any] = {
            "job_name": ctx.job_id,
            "nodes": spec.nodes,
            "ntasks_per_node": 1,
            "time": time_to_minutes(str(s.time)),
            "signal_delay_s": s.signal_delay_s,
            "wckey": None,
            "additional_parameters": additional,
        }
        optional = {
            "partition": s.partition, "account": s.account, "qos": s.qos, "constraint": s.constraint,
            "cpus_per_task": cpus, "gpus_per_node": gpus or None, "mem": slurm_memory(memory) if memory else None,
            "exclusive": True if s.exclusive else None, "setup": list(s.setup) or None,
            "srun_args": srun_args,
            "array_parallelism": (s.array_parallelism or len(elements_spec)) if array else None,
        }
        executor_params.update({k: v for k, v in optional.items() if v is not None})
        map_count = len(elements_spec) if array else None
        script = sbatch_script(executor_params, job_dir=job_dir, python=submit_python, map_count=map_count)

        common = {
            "job_id": ctx.job_id, "job_dir": job_dir, "nodes": spec.nodes, "procs_per_node": procs_per_node,
            "python": python, "submit_python": submit_python, "workdir": workdir, "max_restarts": spec.max_restarts,
            "master_port": spec.master_port, "requeue": s.requeue, "signal_delay_s": s.signal_delay_s,
            "max_timeouts": s.max_timeouts,
            "env": dist.process_env(spec, "slurm", cpus_per_node=cpus, procs_per_node=procs_per_node),
        }
        elements = [
            {"index": el.index, "params": el.params, "output_dir": el.output_dir, "env": el.env,
             "program": worker_command(el.command, python)}
            for el in elements_spec
        ]
        payload = {
            "common": common, "elements": elements, "executor_params": executor_params, "map_count": map_count,
            "script": script, "run_dir": ctx.run_dir,
            "submission_file": f"{job_dir}/" + ("<SLURM_ARRAY_JOB_ID>" if array else "<SLURM_JOB_ID>") + "_submission.sh",
            # For the CLI's one-line summary.
            "nodes": spec.nodes, "procs_per_node": procs_per_node,
        }
        return Plan("slurm", ctx.job_id, spec.name, ctx.run_dir, render_plan(payload), payload, spec.master_port)

    # ------------------------------------------------------------------ submit

    def submit(self, plan: Plan) -> dict[str, Any]:
        try:
            from launcher.targets import slurm_submit
        except ModuleNotFoundError as e:
            if e.name == "submitit" or (e.name or "").startswith("submitit."):
                raise TargetUnavailable("the slurm target needs submitit: pip install 'ddpjob[slurm]'") from e
            raise
        p = plan.payload
        run_dir = Path(plan.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.txt").write_text(plan.render())
        (run_dir / "plan.json").write_text(json.dumps(p, indent=1, sort_keys=True))
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
        c = p["common"]
        return {
            "slurm_job_id": slurm_id, "array": p["map_count"] is not None, "runs": len(p["elements"]),
            "nodes": c["nodes"], "procs_per_node": c["procs_per_node"], "job_dir": c["job_dir"],
            "submission_file": script_path, "run_dir": plan.run_dir, "job_id": plan.job_id,
            "params": [el["params"] for el in p["elements"]],
        }

    # ------------------------------------------------------------------ status

    def status(self, handle: dict[str, Any]) -> JobStatus:
        return self.status_many({"_": handle})["_"]

    def status_many(self, handles: dict[str, dict[str, Any]]) -> dict[str, JobStatus]:
        records = slurm_query.query([h["slurm_job_id"] for h in handles.values()])
        return {job_id: _job_status(h, records) for job_id, h in handles.items()}

    # ------------------------------------------------------------------ logs

    def logs(self, handle: dict[str, Any], flt: LogFilter, follow: bool = False) -> Iterator[str]:
        """Lines of each run's node logs (``<job dir>/task-<i>/node-<n>.log``), prefixed with task,
        node and rank.

        1. Without ``follow``: what the log files hold now, then stop; a run that has not started
           (still pending) has no files and yields nothing.
        2. With ``follow``: existing lines, then new ones; files that do not exist yet (pending
           runs of an array, nodes still starting) are waited for. Stops once Slurm reports the job
           terminal and every file is drained. Slurm is asked at most every few seconds (backing
           off to 10 s), never once per poll of the files.
        3. ``tail=N``: the last N lines of each file before following.
        4. ``task``/``node``/``rank`` select one run, node or global rank; an unknown task is an error.
        5. A requeued run appends to the same files; a ``[ddpjob] ... start K`` line marks each start.
        """
        runs = handle["runs"]
        if flt.task is not None and not 0 <= flt.task < runs:
            raise TargetError(f"task {flt.task} does not exist (this job has {runs} run(s): 0..{runs - 1})")
        srcs = []
        for index in range(runs):
            if flt.task is not None and index != flt.task:
                continue
            for node in range(handle["nodes"]):
                if flt.node is not None and node != flt.node:
                    continue
                label = (f"task{index} " if runs > 1 else "") + f"node{node}"
                srcs.append(LogSource(node_paths(handle["job_dir"], index, node)["log"], label, node,
                                      handle["procs_per_node"], index))
        yield from follow_files(srcs, tail=flt.tail, rank=flt.rank, follow=follow,
                                finished=_polite(lambda: self.status(handle).state.terminal), poll=0.2)

    # ------------------------------------------------------------------ cancel

    def cancel(self, handle: dict[str, Any]) -> None:
        self._cancel(handle, None)

    def cancel_task(self, handle: dict[str, Any], index: int) -> None:
        """Cancel one run of an array (``scancel <id>_<index>``); the other runs go on."""
        if not handle["array"] or not 0 <= index < handle["runs"]:
            raise TargetError(f"task {index} does not exist (this job has {handle['runs']} run(s))")
        self._cancel(handle, index)

    def _cancel(self, handle: dict[str, Any], index: int | None) -> None:
        jid = handle["slurm_job_id"] + (f"_{index}" if index is not None else "")
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


def _mounts(paths: list[str], extra: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if p not in out:
            out.append(p)
    out += [m for m in extra if m not in out]
    return out


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


def _job_status(handle: dict[str, Any], records: dict[str, slurm_query.SlurmRecord]) -> JobStatus:
    jid = handle["slurm_job_id"]
    tasks = []
    for index in range(handle["runs"]):
        nid = f"{jid}_{index}" if handle["array"] else jid
        rec = records.get(nid)
        params = handle.get("params", [{}] * handle["runs"])[index]
        nodes = _node_records(handle, index)
        if rec is None:
            tasks.append(TaskStatus(index, JobState.UNKNOWN, f"Slurm has no record of job {nid} (no accounting and "
                                    "purged from the controller?)", nodes, params, nid))
            continue
        state = slurm_query.map_state(rec.state)
        message = _message(handle, index, rec, state, nodes)
        tasks.append(TaskStatus(index, state, message, nodes, params, nid))
    overall = combine([t.state for t in tasks])
    if len(tasks) == 1:
        message = tasks[0].message
    else:
        failed = [t for t in tasks if t.state == JobState.FAILED]
        message = f"task {failed[0].index} failed: {failed[0].message}" if failed else ""
    details = {"run_dir": handle.get("run_dir"), "slurm_job_id": jid, "job_dir": handle["job_dir"],
               "source": ",".join(sorted({r.source for k, r in records.items() if k == jid or k.startswith(jid + "_")}))}
    return JobStatus(overall, message, tasks, details)


def _node_records(handle: dict[str, Any], index: int) -> list[dict[str, Any]]:
    out = []
    for node in range(handle["nodes"]):
        try:
            with open(node_paths(handle["job_dir"], index, node)["record"], encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        out.append({k: rec[k] for k in ("node", "host", "rendezvous", "state", "exit_code", "restart") if k in rec})
    return out


def _message(handle: dict[str, Any], index: int, rec: slurm_query.SlurmRecord, state: JobState,
             nodes: list[dict[str, Any]]) -> str:
    if state == JobState.PENDING:
        return f"{rec.state.split(' ')[0].lower()}" + (f": {rec.reason}" if rec.reason and rec.reason != "None" else "")
    if state == JobState.CANCELLED:
        return rec.state.lower()
    if state != JobState.FAILED:
        return ""
    bad = [n for n in nodes if n.get("exit_code") not in (0, None)]
    if bad:
        paths = node_paths(handle["job_dir"], index, bad[0]["node"])
        cause = node_failure(node=bad[0]["node"], procs_per_node=handle["procs_per_node"], log=paths["log"],
                             error_file=paths["error_file"], torchrun_log_dir=paths["torchrun_log_dir"])
        return f"node {bad[0]['node']} ({bad[0].get('host', '?')}): {cause}"
    sid = handle["slurm_job_id"] + (f"_{index}" if handle["array"] else "")
    # No node reported a torchrun failure: Slurm itself (time limit, memory, node failure) or the
    # node runner before torchrun (see submitit's log).
    return (f"Slurm state {rec.state}" + (f", exit code {rec.exit_code}" if rec.exit_code else "")
            + f"; see {handle['job_dir']}/{sid}_0_log.err")
