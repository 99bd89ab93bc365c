"""Kubernetes target: one Kubeflow ``PyTorchJob`` (kubeflow.org/v1) per run of the job.

``plan`` renders plain dicts (``k8s_render``) and checks them with the strict CRD validator and
the operator's webhook rules (``k8s_schema``); nothing here imports the kubernetes client until a
method talks to a cluster (``k8s_client``). What ``render`` prints is what ``submit`` sends, apart
from ``metadata.namespace``, which is filled from the kubeconfig context when the spec has none.

Handle (stored in the registry)::

    {"job_id": "quickstart-ab2cd", "run_dir": "~/.ddpjob/runs/quickstart-ab2cd",
     "context": "kind-ddpjob", "namespace": "default", "nodes": 2, "procs_per_node": 1, "elastic": false,
     "jobs": [{"index": 0, "name": "quickstart-ab2cd", "params": {}}]}

Run directory: ``plan.txt`` (the manifests sent), ``plan.json``, ``k8s-status.json`` (the last
state seen per PyTorchJob, used once a job has been deleted) and ``pods/`` (every log line read;
see ``k8s_logs``).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher.errors import DdpjobError, Issue, TargetError
from launcher.specload import LoadedSpec
from launcher.states import JobState, combine
from launcher.targets.base import JobStatus, LogFilter, Plan, PlanContext, Target, TaskStatus
from launcher.targets.k8s_render import (
    LABEL_JOB_ID, LABEL_OPERATOR_JOB, crd_available, render, render_text, spec_field, spec_issues,
)

# PyTorchJob condition type -> ddpjob state. Anything else (a newer operator's condition) -> UNKNOWN.
PYTORCHJOB_CONDITIONS: dict[str, JobState] = {
    "Created": JobState.PENDING,
    "Running": JobState.RUNNING,
    "Restarting": JobState.RUNNING,
    "Succeeded": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "Suspended": JobState.PENDING,  # e.g. held by Kueue until admitted
}
NOT_RECONCILED = ("submitted, but not reconciled yet: is the training operator installed and running? "
                  "(kubectl get pods -A -l control-plane=kubeflow-training-operator)")
STATUS_FILE = "k8s-status.json"


def condition_state(status: dict[str, Any] | None) -> tuple[JobState, str]:
    """The state of one PyTorchJob from ``status.conditions``.

    Failed, Succeeded, then Suspended win when True; otherwise the latest True condition among
    Restarting/Running/Created (they are appended in order). No conditions: not reconciled yet.
    """
    conds = [c for c in (status or {}).get("conditions") or [] if isinstance(c, dict)]
    if not conds:
        return JobState.PENDING, NOT_RECONCILED
    true = [c for c in conds if c.get("status") == "True"]
    for ctype in ("Failed", "Succeeded", "Suspended"):
        for c in true:
            if c.get("type") == ctype:
                return PYTORCHJOB_CONDITIONS[ctype], _cond_message(c)
    latest = true[-1] if true else conds[-1]
    return PYTORCHJOB_CONDITIONS.get(str(latest.get("type")), JobState.UNKNOWN), _cond_message(latest)


def _cond_message(c: dict[str, Any]) -> str:
    return str(c.get("message") or c.get("reason") or c.get("type") or "")


def replica_summary(status: dict[str, Any] | None) -> str:
    """``Master: 1 active; Worker: 1 active, 2 succeeded`` from ``status.replicaStatuses``."""
    parts = []
    for rtype, counts in sorted(((status or {}).get("replicaStatuses") or {}).items()):
        nums = [f"{counts.get(k)} {k}" for k in ("active", "succeeded", "failed") if counts.get(k)]
        parts.append(f"{rtype}: {', '.join(nums) or '0 active'}")
    return "; ".join(parts)


class KubernetesTarget(Target):
    """Submits PyTorchJobs with the official kubernetes client (``pip install 'ddpjob[k8s]'``)."""

    name = "k8s"

    # ------------------------------------------------------------------ plan
    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan:
        spec = loaded.spec
        issues = spec_issues(spec, ctx.job_id)
        if issues:
            raise loaded.error(issues)
        rendered = render(spec, ctx.job_id)
        ok, why = crd_available()
        notes = []
        if ok:
            from launcher.targets.k8s_schema import dotted, validate_pytorchjob

            found: dict[tuple[Any, ...], Issue] = {}
            for obj in rendered.objects:
                for si in validate_pytorchjob(obj):
                    path = spec_field(si.path, spec)
                    message = f"the PyTorchJob's {dotted(si.path)}: {si.message}"
                    found.setdefault((path, dotted(si.path[:2] + si.path[3:]), si.message), Issue(path, message))
            if found:
                raise loaded.error(list(found.values()))
            notes.append("checked: PyTorchJob CRD schema (strict) and the training operator's rules")
        else:
            notes.append(f"not checked locally: {why}")
        if spec.workdir is not None and spec.k8s.workdir is None:
            notes.append("workdir: is a path on this machine and is not used in the pods; set k8s.workdir "
                         "(default: the image's WORKDIR)")
        payload = {
            "job_id": ctx.job_id, "run_dir": ctx.run_dir, "nodes": spec.nodes, "procs_per_node": rendered.procs_per_node,
            "namespace": spec.k8s.namespace, "context": spec.k8s.context, "elements": rendered.elements,
            "manifests": rendered.objects,
        }
        text = render_text(rendered, ctx.job_id, spec.k8s.namespace, notes)
        return Plan("k8s", ctx.job_id, spec.name, ctx.run_dir, text, payload, None)

    # ------------------------------------------------------------------ submit
    def submit(self, plan: Plan) -> dict[str, Any]:
        p = plan.payload
        kube = _kube(p["context"], p["namespace"])
        run_dir = Path(plan.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.txt").write_text(plan.render())
        (run_dir / "plan.json").write_text(json.dumps(p, indent=1, sort_keys=True))
        created: list[str] = []
        try:
            for obj in _bodies(p, kube.namespace):
                kube.create_job(obj)
                created.append(obj["metadata"]["name"])
        except BaseException:
            # A sweep is all or nothing: take back the elements already created.
            for name in created:
                try:
                    kube.delete_job(name)
                except DdpjobError:
                    pass
            raise
        return {
            "job_id": plan.job_id, "run_dir": plan.run_dir, "context": kube.context, "namespace": kube.namespace,
            "nodes": p["nodes"], "procs_per_node": p["procs_per_node"],
            "elastic": any("elasticPolicy" in m["spec"] for m in p["manifests"]),
            "jobs": [{"index": e["index"], "name": e["name"], "params": e["params"]} for e in p["elements"]],
        }

    def server_dry_run(self, plan: Plan) -> str:
        p = plan.payload
        kube = _kube(p["context"], p["namespace"])
        names = []
        for obj in _bodies(p, kube.namespace):
            kube.create_job(obj, dry_run=True)
            names.append(obj["metadata"]["name"])
        return (f"# server dry run (dryRun=All, fieldValidation=Strict) on {kube.host}, namespace {kube.namespace}: "
                f"{len(names)} PyTorchJob(s) accepted: {', '.join(names)}")

    # ------------------------------------------------------------------ status
    def status(self, handle: dict[str, Any]) -> JobStatus:
        kube = _kube(handle["context"], handle["namespace"])
        return self._status(kube, handle, pods=True)

    def status_many(self, handles: dict[str, dict[str, Any]]) -> dict[str, JobStatus]:
        kubes: dict[tuple[str | None, str], Any] = {}
        out = {}
        for job_id, handle in handles.items():
            key = (handle.get("context"), handle["namespace"])
            if key not in kubes:
                kubes[key] = _kube(*key)
            out[job_id] = self._status(kubes[key], handle, pods=False)  # one list call per job
        return out

    def _status(self, kube: Any, handle: dict[str, Any], *, pods: bool) -> JobStatus:
        objs = {o["metadata"]["name"]: o for o in kube.list_jobs(f"{LABEL_JOB_ID}={handle['job_id']}")}
        seen = _read_seen(handle["run_dir"])
        tasks = []
        replicas = []
        for el in handle["jobs"]:
            obj = objs.get(el["name"])
            if obj is None:
                last = seen.get(el["name"])
                if last and JobState.parse(last["state"]).terminal:
                    state, msg = JobState.parse(last["state"]), last.get("message", "") + " (the PyTorchJob has since been deleted)"
                else:
                    state, msg = JobState.CANCELLED, ("the PyTorchJob no longer exists (deleted with kubectl or "
                                                      "ddpjob cancel, or by its TTL) and its final state was not seen")
                tasks.append(TaskStatus(el["index"], state, msg, params=el.get("params", {}), native_id=el["name"]))
                continue
            state, msg = condition_state(obj.get("status"))
            summary = replica_summary(obj.get("status"))
            if summary:
                replicas.append(summary if len(handle["jobs"]) == 1 else f"{el['name']}: {summary}")
            nodes: list[dict[str, Any]] = []
            if pods and not state.terminal:
                nodes, pending = _pod_nodes(kube, el["name"])
                if pending:
                    msg = "; ".join([msg, *pending]) if msg and msg != NOT_RECONCILED else "; ".join(pending) or msg
            seen[el["name"]] = {"state": state.value, "message": msg}
            tasks.append(TaskStatus(el["index"], state, msg, nodes, el.get("params", {}), el["name"]))
        _write_seen(handle["run_dir"], seen)
        overall = combine([t.state for t in tasks])
        if len(tasks) == 1:
            message = tasks[0].message
        else:
            counts: dict[str, int] = {}
            for t in tasks:
                counts[t.state.value] = counts.get(t.state.value, 0) + 1
            message = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
            failed = next((t for t in tasks if t.state == JobState.FAILED), None)
            if failed is not None:
                message += f"; task {failed.index}: {failed.message}"
        details = {"namespace": handle["namespace"], "context": handle.get("context"),
                   "pytorchjobs": ", ".join(el["name"] for el in handle["jobs"])}
        if replicas:
            details["replicas"] = " | ".join(replicas)
        return JobStatus(overall, message, tasks, details)

    # ------------------------------------------------------------------ logs
    def logs(self, handle: dict[str, Any], flt: LogFilter, follow: bool = False) -> Iterator[str]:
        """Lines of every pod, prefixed ``[master-0 rank0]``; see ``launcher.targets.k8s_logs`` for the rules."""
        from launcher.targets.k8s_logs import PodLogs

        elements = [{"index": j["index"], "name": j["name"]} for j in handle["jobs"]]
        if flt.task is not None and not any(e["index"] == flt.task for e in elements):
            raise TargetError(f"task {flt.task} does not exist (this job has {len(elements)} task(s))")
        try:
            kube = _kube(handle["context"], handle["namespace"])
        except DdpjobError:
            if follow or not (Path(handle["run_dir"]) / "pods").is_dir():
                raise
            kube = None  # the cluster is out of reach: what was persisted is still worth showing
        elastic = bool(handle.get("elastic"))
        if elastic and flt.rank is not None:
            raise TargetError("--rank is not available for elastic jobs: ranks are assigned at each rendezvous, "
                              "not by replica; use --node")
        reader = PodLogs(kube, handle["run_dir"], elements, int(handle.get("procs_per_node") or 1), flt, elastic)
        if not follow:
            yield from reader.snapshot()
            return
        yield from reader.follow(lambda: self._status(kube, handle, pods=False).state.terminal)

    # ------------------------------------------------------------------ cancel
    def cancel(self, handle: dict[str, Any]) -> None:
        kube = _kube(handle["context"], handle["namespace"])
        for el in handle["jobs"]:
            kube.delete_job(el["name"])  # foreground propagation; a 404 means already gone


def _kube(context: str | None, namespace: str | None) -> Any:
    from launcher.targets.k8s_client import Kube

    return Kube(context, namespace)


def _bodies(payload: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    out = []
    for obj in payload["manifests"]:
        body = copy.deepcopy(obj)
        meta = {"name": body["metadata"]["name"], "namespace": namespace}
        meta.update({k: v for k, v in body["metadata"].items() if k not in ("name", "namespace")})
        body["metadata"] = meta
        out.append(body)
    return out


def _pod_nodes(kube: Any, job_name: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Per-pod rows for ``status`` and the scheduling events of Pending pods."""
    from launcher.targets.k8s_logs import pod_ref

    nodes = []
    pending = []
    for pod in kube.list_pods(f"{LABEL_OPERATOR_JOB}={job_name}"):
        name = pod["metadata"]["name"]
        ref = pod_ref(name, [{"index": 0, "name": job_name}], False)
        st = pod.get("status") or {}
        cs = next((c for c in st.get("containerStatuses") or [] if c.get("name") == "pytorch"), {})
        row: dict[str, Any] = {"node": ref.node if ref else name, "pod": name, "phase": st.get("phase", "?"),
                               "restarts": cs.get("restartCount", 0)}
        term = (cs.get("state") or {}).get("terminated")
        if term:
            row["exit_code"] = term.get("exitCode")
        nodes.append(row)
        if st.get("phase") == "Pending":
            events = [e for e in kube.pod_events(name) if e.get("type") == "Warning" or e.get("reason") == "FailedScheduling"]
            if events:
                e = events[-1]
                pending.append(f"{name} Pending: {e.get('reason')}: {e.get('message')}")
            else:
                pending.append(f"{name} Pending")
    nodes.sort(key=lambda n: (str(type(n["node"])), n["node"]))
    return nodes, pending


def _read_seen(run_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(run_dir, STATUS_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_seen(run_dir: str, seen: dict[str, Any]) -> None:
    try:
        os.makedirs(run_dir, exist_ok=True)
        tmp = os.path.join(run_dir, f"{STATUS_FILE}.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(seen, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(run_dir, STATUS_FILE))
    except OSError:
        pass  # a cache only
