"""The Slurm target's status: Slurm's record of each run, the node runners' records, the root
cause of a failure and the stall watch of a running run (``launcher.targets.shared.heartbeat``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from launcher.core.jsondata import JSONObject, integer, number
from launcher.core.states import JobState, summarize
from launcher.targets.jobstatus import JobStatus, NodeStatus, TaskStatus
from launcher.targets.shared.files import read_json
from launcher.targets.shared.recovery import with_losses
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm.payload import SlurmHandle, node_paths

if TYPE_CHECKING:
    from launcher.targets.base import LogFilter
    from launcher.targets.shared.stacks import JobStacks
    from launcher.targets.slurm import query as slurm_query


def job_status(handle: SlurmHandle, records: dict[str, slurm_query.SlurmRecord]) -> JobStatus:
    from launcher.targets.slurm import query as slurm_query

    jid = handle.slurm_job_id
    tasks = []
    for index in range(handle.runs):
        nid = f"{jid}_{index}" if handle.array else jid
        rec = records.get(nid)
        params = handle.params[index] if index < len(handle.params) else {}
        nodes = node_records(handle, index)
        if rec is None:
            tasks.append(TaskStatus(index, JobState.UNKNOWN, f"Slurm has no record of job {nid} (no accounting and "
                                    "purged from the controller?)", _typed(nodes), params, nid))
            continue
        state = slurm_query.map_state(rec.state)
        message = _message(handle, index, rec, state, nodes)
        recovered = RunFolder(handle.job_dir).task(index).read_recovery()
        if recovered is not None:
            state, message = _recovered(handle, index, recovered, nodes, state, message,
                                        held=slurm_query.held(rec.state))
        elif state in (JobState.RUNNING, JobState.CANCELLED):
            state, message = _stall(handle, index, nodes, state, message, held=slurm_query.held(rec.state))
        # When it started and ended as Slurm records them (sacct's Start and End), not when ddpjob asked.
        task = TaskStatus(index, state, message, _typed(nodes), params, nid, started=rec.started,
                          ended=rec.ended if state.terminal else None)
        if recovered is not None:
            _told(task, recovered)
        tasks.append(task)
    overall, message = summarize(tasks)
    details: JSONObject = {"run_dir": handle.run_dir, "slurm_job_id": jid, "job_dir": handle.job_dir,
               **({"container": handle.container} if handle.container else {})}
    source = ",".join(sorted({r.source for k, r in records.items() if k == jid or k.startswith(jid + "_")}))
    return with_losses(JobStatus(overall, message, tasks, details, source=source))


def _recovered(handle: SlurmHandle, index: int, recovered: Mapping[str, object], nodes: list[Row],
               state: JobState, message: str, *, held: bool) -> tuple[JobState, str]:
    """A run that lost nodes (``slurm/job/recover.py``): its nodes outside the run are ``lost`` (or
    ``left``), and its outcome is the first node's, not Slurm's (which records the step cancelled to
    end srun's wait for the lost node's task as FAILED or CANCELLED)."""
    members = recovered.get("members")
    members = members if isinstance(members, list) else []
    for n in nodes:
        if _node(n) not in members and n.get("state") != "left":
            n["state"] = "lost"
    outcome, reason = recovered.get("outcome"), recovered.get("reason")
    if outcome is None:
        if state in (JobState.RUNNING, JobState.CANCELLED):
            return _stall(handle, index, [n for n in nodes if _node(n) in members], state, message, held=held)
        return state, message
    if outcome == "succeeded":
        if held:
            return JobState.RUNNING, "ending: the run ended after its losses; Slurm is ending the job step"
        return JobState.SUCCEEDED, ""
    why = str(reason) if isinstance(reason, str) and reason else message
    if held:
        return JobState.RUNNING, f"ending: {why}"
    return JobState.FAILED, why


def _told(task: TaskStatus, recovered: Mapping[str, object]) -> None:
    from launcher.targets.shared import recovery

    metrics, started, ended = recovered.get("metrics"), recovered.get("started"), recovered.get("ended")
    task.started = float(started) if isinstance(started, (int, float)) else task.started
    task.ended = float(ended) if isinstance(ended, (int, float)) else task.ended
    task.losses, task.goodput = recovery.told(recovered.get("losses"), metrics if isinstance(metrics, str) else None,
                                              started=task.started, ended=task.ended, now=time.time())


def _stall(handle: SlurmHandle, index: int, nodes: list[Row], state: JobState,
           message: str, *, held: bool) -> tuple[JobState, str]:
    """A running run's stall, from the first node's watch (``shared.heartbeat``). A run that the watch
    ended (stall.action: fail; its runner then cancels the job) is FAILED with its reason once Slurm
    no longer holds the allocation: cancelled, or completing while Slurm waits for a node it cannot
    reach (nothing scancel can hurry). Until then it is RUNNING, ending."""
    from launcher.targets.shared.heartbeat import report

    ended = [n for n in nodes if n.get("error") and n.get("state") == "exited"]
    if ended:
        first = min(ended, key=_when)
        if held:
            return state, f"ending: {first['error']}; Slurm still holds the allocation (ddpjob cancel frees it)"
        return JobState.FAILED, str(first["error"])
    if state != JobState.RUNNING:
        return state, message
    watch = read_json(node_paths(handle.job_dir, index, 0)["watch"])
    note = report(watch, time.time()) if isinstance(watch, dict) else None
    return state, note or message


# A node runner's record (``slurm/job/node.py``) as status reads it: its keys in ``node_records``.
Row = dict[str, object]


def _node(n: Row) -> int:
    """The node's number (``node_records`` made it one)."""
    node = integer(n.get("node"))
    return node if node is not None else -1


def _when(n: Row) -> tuple[float, int]:
    """The order nodes ended in: when (unknown first), then by number."""
    return number(n.get("ended")) or 0.0, _node(n)


def _typed(nodes: list[Row]) -> list[NodeStatus]:
    return [NodeStatus.of(n) for n in nodes]


def node_records(handle: SlurmHandle, index: int) -> list[Row]:
    out = []
    for node in range(handle.nodes):
        rec = read_json(node_paths(handle.job_dir, index, node)["record"])
        if not isinstance(rec, dict):
            continue
        row: Row = {k: rec[k] for k in ("node", "host", "address", "interface", "rendezvous", "state", "exit_code",
                                        "restart", "start", "rank", "ended", "error", "left") if k in rec}
        if not isinstance(row.get("node"), int):
            row["node"] = node
        out.append(row)
    return out


def _message(handle: SlurmHandle, index: int, rec: slurm_query.SlurmRecord, state: JobState,
             nodes: list[Row]) -> str:
    from launcher.targets.shared.rootcause import NodeFailure, first_failure

    if state == JobState.PENDING:
        return f"{rec.state.split(' ')[0].lower()}" + (f": {rec.reason}" if rec.reason and rec.reason != "None" else "")
    if state == JobState.CANCELLED:
        return rec.state.lower()
    if state != JobState.FAILED:
        return ""
    bad = {_node(n): n for n in nodes if n.get("exit_code") not in (0, None)}
    stopped = sorted((n for n in bad.values() if n.get("error")), key=_when)
    if stopped:  # the node runner stopped before torchrun (an interface or a name this node lacks)
        others = sorted(set(bad) - {_node(stopped[0])})
        return str(stopped[0]["error"]) + (f" (node(s) {', '.join(map(str, others))} stopped too)" if others else "")
    if bad:
        failures = []
        for node, n in bad.items():
            paths = node_paths(handle.job_dir, index, node)
            failures.append(NodeFailure(node, paths["log"], paths["error_file"], paths["torchrun_log_dir"],
                                        number(n.get("ended"))))
        first, cause, after = first_failure(failures, handle.procs_per_node)
        text = f"node {first.node} ({bad[first.node].get('host', '?')}): {cause}"
        return text + (f" (then node(s) {', '.join(map(str, after))} failed after it)" if after else "")
    sid = handle.slurm_job_id + (f"_{index}" if handle.array else "")
    # No node reported a torchrun failure: Slurm itself (time limit, memory, node failure) or the
    # node runner before torchrun (see submitit's log).
    return (f"Slurm state {rec.state}" + (f", exit code {rec.exit_code}" if rec.exit_code else "")
            + f"; see {RunFolder(handle.job_dir).submitit_log(sid, '0', 'err')}")


def recorded_status(handle: SlurmHandle, state: JobState, message: str, why: str) -> JobStatus:
    """The status of a job that ended, from ddpjob's record and the node runners' records in the job
    folder, for when Slurm cannot be asked (the controller out of reach, no ``SLURM_CONF`` here): each
    run's state from its nodes' exit codes where every node left one, else the job's."""
    tasks = []
    for index in range(handle.runs):
        nodes = node_records(handle, index)
        codes = [n.get("exit_code") for n in nodes]
        own = (state if len(codes) < handle.nodes or None in codes
               else JobState.SUCCEEDED if all(c == 0 for c in codes) else JobState.FAILED)
        params = handle.params[index] if index < len(handle.params) else {}
        nid = f"{handle.slurm_job_id}_{index}" if handle.array else handle.slurm_job_id
        tasks.append(TaskStatus(index, own, message if handle.runs == 1 else "", _typed(nodes), params, nid))
    details: JSONObject = {"run_dir": handle.run_dir, "slurm_job_id": handle.slurm_job_id, "job_dir": handle.job_dir}
    return JobStatus(state, message, tasks, details, source=f"ddpjob's record and the job folder; {why}")



def ask_stacks(handle: SlurmHandle, flt: LogFilter) -> JobStacks:
    """``ddpjob stacks`` on Slurm: each node's runner answers through the job's shared folder
    (``shared/stackshare.Answerer``); the task ``flt`` names, else the latest whose watch was written lately."""
    from launcher.core.errors import TargetError
    from launcher.targets.shared.stacks import JobStacks
    from launcher.targets.shared.stackshare import ask

    folder = RunFolder(handle.job_dir)
    fresh = [i for i in range(handle.runs) if os.path.exists(folder.task(i).watch)
             and time.time() - os.path.getmtime(folder.task(i).watch) < 30]
    index = flt.task if flt.task is not None else (fresh[-1] if fresh else None)
    if index is None or index not in fresh:
        which = f"task {index}" if index is not None else "the job"
        raise TargetError(f"no live rank to read: {which} is not running (its first node's watch wrote nothing in 30 s)")
    task = folder.task(index)
    ranks, note = ask(task.stacks_request, [task.node_stacks(n) for n in range(handle.nodes)], handle.nodes)
    ranks = [r for r in ranks if flt.node in (None, r.node) and flt.rank in (None, r.rank)]
    return JobStacks(index, ranks, note)
