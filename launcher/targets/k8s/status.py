"""The Kubernetes target's status: each run's object (a PyTorchJob or a TrainJob) read through the
API server, its pods while it runs, the stall watch its first pod's runner serves (``cluster.watch``)
and, for a run that failed, the stall that ended it."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from launcher.core.jsondata import JSONObject, number, obj, text
from launcher.core.states import JobState, summarize
from launcher.targets.jobstatus import JobStatus, NodeStatus, TaskStatus
from launcher.targets.k8s.cluster.pods import object_warnings, pod_nodes
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi
from launcher.targets.k8s.objects.flavours import flavour_of
from launcher.targets.k8s.objects.render import LABEL_JOB_ID
from launcher.targets.k8s.payload import K8sHandle
from launcher.targets.shared.files import read_json, write_json
from launcher.targets.shared.recovery import with_losses
from launcher.targets.shared.runfolder import RunFolder

if TYPE_CHECKING:
    from launcher.targets.k8s.cluster.client import Kube


def job_status(kube: Kube, handle: K8sHandle, *, pods: bool) -> JobStatus:
    """Each run's state from its object's status (``objects.flavours``), with its pods' nodes and what
    they wait on (``pods``: ``status``; ``list`` asks once per job, without them), the stall watch's note
    of a running run and the stall that ended a failed one; the last state seen is kept in the run folder
    (``k8s-status.json``) for when the object has been deleted."""
    flavour = flavour_of(handle.api)
    api = flavour.api
    objs = {text(obj(o.get("metadata")).get("name")): o for o in kube.list_jobs(f"{LABEL_JOB_ID}={handle.job_id}")}
    seen = _read_seen(handle.run_dir)
    tasks = []
    replicas = []
    for el in handle.jobs:
        found = objs.get(el.name)
        if found is None:
            last = obj(seen.get(el.name))
            if last and JobState.parse(text(last.get("state"))).terminal:
                state, msg = JobState.parse(text(last.get("state"))), text(last.get("message")) + f" (the {api.kind} has since been deleted)"
                started, ended = number(last.get("started")), number(last.get("ended"))  # as its object said before it went
            else:
                state, msg = JobState.CANCELLED, (f"the {api.kind} no longer exists (deleted with kubectl or "
                                                  "ddpjob cancel, or by its TTL) and its final state was not seen")
                started = ended = None
            tasks.append(TaskStatus(el.index, state, msg, params=el.params, native_id=el.name, started=started,
                                    ended=ended))
            continue
        state, msg = flavour.state(found.get("status"))
        if state == JobState.FAILED and handle.watch_port:
            msg = _ending(kube, el.name, api, obj(seen.get(el.name)), msg)
        summary = flavour.summary(found.get("status"))
        if summary:
            replicas.append(summary if len(handle.jobs) == 1 else f"{el.name}: {summary}")
        nodes: list[dict[str, object]] = []
        if pods and not state.terminal:
            nodes, pending = pod_nodes(kube, el.name, api)
            if api is not PYTORCHJOB and state == JobState.PENDING:
                pending += object_warnings(kube, el.name)
            if pending:
                msg = "; ".join([msg, *pending]) if msg and "not reconciled" not in msg else "; ".join(pending) or msg
        watched: JSONObject | None = None
        if state == JobState.RUNNING and handle.watch_port:
            from launcher.targets.k8s.cluster.watch import first_pod, note

            said = _restarting_after_end(kube, el.name, api, nodes) if pods else None
            if said is None:
                said, watched = note(kube, first_pod(kube, el.name, api, nodes if pods else None), handle.watch_port)
            if said is None and not pods:  # list: no pod rows, and a watch not served may be a pod
                said = _restarting_after_end(kube, el.name, api, None)  # restarting
            msg = (f"{msg}; {said}" if msg and said.startswith("watch unreadable") else said) if said else msg
        started, ended = times(found.get("status"), state)
        asked = obj(seen.get(el.name)).get("told") is True  # the ended run's first pod's log (``last_told``)
        seen[el.name] = {"state": state.value, "message": msg, "started": started, "ended": ended,
                         **({"told": True} if state.terminal and handle.watch_port else {})}
        task = TaskStatus(el.index, state, msg, [NodeStatus.of(n) for n in nodes], el.params, el.name, started=started,
                          ended=ended)
        if handle.watch_port:
            final = None
            if state.terminal and not asked:  # asked once, when the run is first seen ended
                from launcher.targets.k8s.cluster.watch import last_told

                final = last_told(kube, el.name, api)
            _told(task, handle.run_dir, watched, ended, final)
        tasks.append(task)
    _write_seen(handle.run_dir, seen)
    overall, message = summarize(tasks)
    details: JSONObject = {"namespace": handle.namespace, "context": handle.context,
               api.plural: ", ".join(el.name for el in handle.jobs)}
    if replicas:
        details["replicas"] = " | ".join(replicas)
    return with_losses(JobStatus(overall, message, tasks, details))


def times(status: object, state: JobState) -> tuple[float | None, float | None]:
    """When a run's object (a PyTorchJob or a TrainJob) started and, once ``state`` has ended, ended, as
    the API server records them: ``status.startTime``, ``status.completionTime``, else the
    ``lastTransitionTime`` of its condition that says it ended (a TrainJob keeps neither time); None
    where it does not say."""
    status = obj(status)
    listed = status.get("conditions")
    conds = [c for c in listed if isinstance(c, dict) and c.get("status") == "True"] if isinstance(listed, list) else []
    ends = [c.get("lastTransitionTime") for c in conds if c.get("type") in ("Succeeded", "Complete", "Failed")]
    ended = (_when(status.get("completionTime")) or max((t for t in map(_when, ends) if t is not None), default=None)
             if state.terminal else None)
    return _when(status.get("startTime")), ended


def _when(stamp: object) -> float | None:
    """An API server's time (``2026-11-28T10:00:00Z``) in seconds since the epoch, or None."""
    import calendar

    try:
        return float(calendar.timegm(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ"))) if stamp else None
    except ValueError:
        return None


def _told(task: TaskStatus, run_dir: str, watched: JSONObject | None, ended: float | None,
          final: JSONObject | None = None) -> None:
    """The run's lost pods and its goodput, from the first pod's ``watch.json`` (``podrun``: the recovery's
    record and the metrics lines that tell it): read now (kept in the run folder), else as last kept; for a
    run seen ended, what its first pod's runner said of them last (``final``, kept over the last read)."""
    from launcher.targets.k8s.cluster.watch import kept
    from launcher.targets.shared import recovery

    path = kept(run_dir, task.index)
    if final is not None and watched is None:
        watched = {"nodes": [], **obj(read_json(path)), **final}
    if watched is not None:
        try:
            write_json(path, watched)
        except OSError:
            pass  # a cache only
    state = watched if watched is not None else obj(read_json(path))
    record = state.get("recovery")
    if not isinstance(record, dict) or not record.get("losses"):
        return
    events = recovery.events(state.get("events"))
    started = record.get("started")
    task.started = float(started) if isinstance(started, (int, float)) else task.started
    updated = state.get("updated")  # the last the watch wrote, else
    task.ended = (ended or (float(updated) if isinstance(updated, (int, float)) else None)) if task.state.terminal else None
    task.losses = recovery.losses(record["losses"], events)
    task.goodput = recovery.goodput(task.started, task.ended, task.losses, events, time.time())


def _ending(kube: Kube, name: str, api: KubeflowApi, last: Mapping[str, object], msg: str) -> str:
    """A FAILED run's message naming why a pod's runner ended it (``watch.ending``), found from the pods the
    first time the run is seen FAILED, by ``status`` or ``list`` (which records a job that ended, so it
    must know the reason as well), and kept in ``k8s-status.json`` after that."""
    if last and last.get("state") == JobState.FAILED.value:
        return str(last.get("message") or msg)
    from launcher.targets.k8s.cluster.watch import ending

    return ending(kube, name, api) or msg


def _read_seen(run_dir: str) -> JSONObject:
    return obj(read_json(RunFolder(run_dir).k8s_status))


def _write_seen(run_dir: str, seen: JSONObject) -> None:
    try:
        os.makedirs(run_dir, exist_ok=True)
        write_json(RunFolder(run_dir).k8s_status, seen)
    except OSError:
        pass  # a cache only


def _restarting_after_end(kube: Kube, name: str, api: KubeflowApi, nodes: list[dict[str, object]] | None) -> str | None:
    """A running run that a pod's runner ended (a stall with ``stall.action: fail``, a loss recovery could
    not survive) while the pod is restarted in place (``objects/runner.py``, the mark): the verdict and
    what follows. ``nodes``: ``status``'s pod rows, where a pod's previous container exited ``END_EXIT``;
    None (``list``): the pods are asked."""
    if nodes is not None and not any(n.get("last_exit_code") == runner.END_EXIT for n in nodes):
        return None
    from launcher.targets.k8s.cluster.watch import ending

    verdict = ending(kube, name, api)  # None: a program of the user's that exits 124 itself
    if verdict is None:
        return None
    who = "stall.action fail" if verdict.startswith("stalled: ") else "recovery"
    return (f"{verdict}; {who} ended it: the pod is restarted in place, its runner exits again at once, until the "
            "backoffLimit fails the job (the kubelet's back-off: minutes; ddpjob cancel ends it now)")
