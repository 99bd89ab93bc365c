"""The local target's status: the supervisor's ``state.json`` while it runs, what the stall watch of
each running run says (``local.watch``), and, when the supervisor is gone without a final state, the
truth from the job's processes and its nodes' exit records."""

from __future__ import annotations

import os
import time

from launcher.core.errors import TargetError
from launcher.core.jsondata import JSONObject
from launcher.core.states import JobState, summarize
from launcher.targets.jobstatus import JobStatus, NodeStatus, TaskStatus
from launcher.targets.local import watch
from launcher.targets.local.job.statefile import read_note
from launcher.targets.local.job.staterecord import StateRecord, read_state
from launcher.targets.local.payload import MARKER, LocalHandle, read_plan
from launcher.targets.shared import procs
from launcher.targets.shared.recovery import with_losses
from launcher.targets.shared.runfolder import RunFolder


def job_status(handle: LocalHandle) -> JobStatus:
    """The supervisor's ``state.json`` while it runs; when it is gone without a final state, the
    truth from the processes themselves: RUNNING while any process of the job lives, then how
    the nodes ended according to their exit records."""
    state = read_state(handle.run_dir)
    details: JSONObject = {"run_dir": handle.run_dir, "port": state.port if state is not None else None}
    if state is not None and state.terminal:
        return with_losses(_status(state, state.message, details))
    if procs.alive(handle.pid, handle.start):
        stale = read_note(handle.run_dir)  # the supervisor could not write state.json (a full disk)
        if stale is not None:
            details["state_file"] = stale
        if state is None:
            return JobStatus(JobState.PENDING, "starting" + (f"; {stale}" if stale else ""), details=details)
        message = watch.running_note(handle.run_dir, state, state.message)
        if stale is not None:
            message = (message + "; " if message else "") + (
                f"this state may be out of date: the supervisor {stale}, keeps supervising and writes it when it can")
        return with_losses(_status(state, message, details))
    # The supervisor is gone. Re-read first: it may have written its final state as it exited.
    state = read_state(handle.run_dir)
    if state is not None and state.terminal:
        return with_losses(_status(state, state.message, details))
    live = procs.marked_pids(MARKER, handle.job_id)
    if live:
        note = (f"the supervisor (pid {handle.pid}) is gone; {len(live)} process(es) of the job run on "
                f"(ddpjob cancel stops them); see {RunFolder(handle.run_dir).supervisor_log}")
        return with_losses(JobStatus(JobState.RUNNING, note, _tasks(state), details))
    return _ended_without_supervisor(handle, details)


def _status(state: StateRecord, message: str, details: JSONObject) -> JobStatus:
    """The job as the supervisor's ``state.json`` tells it, with when it started and ended there."""
    return JobStatus(JobState.parse(state.state), message, _tasks(state), details, started=state.started,
                     ended=state.ended)


def _supervisor_died(handle: LocalHandle) -> str:
    return f"the supervisor (pid {handle.pid}) exited without a final state; see {RunFolder(handle.run_dir).supervisor_log}"


def _tasks(state: StateRecord | None) -> list[TaskStatus]:
    tasks = []
    for t in state.elements if state is not None else []:
        task = TaskStatus(index=t.index, state=JobState.parse(t.state), message=t.message,
                          nodes=[NodeStatus.of(n.to_json()) for n in t.nodes], params=dict(t.params),
                          started=t.started, ended=t.ended)
        if t.losses:  # the nodes it lost and how it came back (job/recover.py), told with its metrics
            from launcher.core.progress import metrics_path
            from launcher.targets.shared import recovery

            metrics = metrics_path(t.output_dir) if t.output_dir is not None else None
            task.losses, task.goodput = recovery.told(t.losses, metrics, started=task.started, ended=task.ended,
                                                      now=time.time())
        tasks.append(task)
    return tasks


def _ended_without_supervisor(handle: LocalHandle, details: JSONObject) -> JobStatus:
    """Every process has ended and the supervisor left no final state: read the nodes' records."""
    from launcher.targets.local.job.node import read_record
    from launcher.targets.shared.runfolder import exit_file

    try:
        plan = read_plan(handle.run_dir)
    except TargetError:
        return JobStatus(JobState.FAILED, _supervisor_died(handle), details=details)
    tasks = []
    for el in plan.elements:
        records = [(n, read_record(exit_file(n.log))) for n in el.nodes]
        nodes = [NodeStatus.of({"node": n.node, "exit_code": r["exit_code"] if r else None, "log": n.log}) for n, r in records]
        if all(r is None for _, r in records):  # a node's log says it started: its record was refused (a full disk)
            ran = any(os.path.exists(n.log) for n in el.nodes)
            tasks.append(TaskStatus(el.index, JobState.FAILED, "ran, but left no exit record (a full disk?): see its logs"
                                    if ran else "not run: the supervisor stopped before it started", nodes, el.params))
            continue
        failed = [(n, r) for n, r in records if r is None or r["exit_code"] != 0]
        ends = [float(e) for _, r in records if r and isinstance(e := r.get("ended"), (int, float))]
        ended = max(ends) if len(ends) == len(records) else None  # when its last node ended
        if not failed:
            tasks.append(TaskStatus(el.index, JobState.SUCCEEDED, "", nodes, el.params, ended=ended))
            continue
        n, r = failed[0]
        if r is None:
            cause = f"node {n.node} left no exit record (killed with the supervisor?)"
        else:
            from launcher.targets.shared.rootcause import killed_node, node_failure

            cause = killed_node(node=n.node, nodes=len(el.nodes), wrapper_pid=None, wrapper_code=None,
                                record=r) or node_failure(node=n.node, procs_per_node=plan.procs_per_node, log=n.log,
                                                          error_file=n.error_file, torchrun_log_dir=n.torchrun_log_dir)
        tasks.append(TaskStatus(el.index, JobState.FAILED, cause, nodes, el.params, ended=ended))
    state, message = summarize(tasks)
    if state.terminal:
        from launcher.targets.local.job import cgroups

        stopped = cgroups.remove_ended(handle.job_id, read_state(handle.run_dir))  # its supervisor would have
        message = "; ".join(x for x in (message, stopped) if x)
        message = (message + " " if message else "") + "(the supervisor was gone: state read from the nodes' exit records)"
    return JobStatus(state, message, tasks, details)


