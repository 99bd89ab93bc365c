"""The loopback API server's Kubeflow Trainer v2 (test code only): TrainJobs, as v2.3.0 handles them.

Plays what shared/reference/kubeflow-trainer/CONTRACT.md describes, for the torch-distributed
ClusterTrainingRuntime: the TrainJob CRD on the apiextensions endpoint (the upstream one from
``$DDPJOB_TRAINJOB_CRD``, else a schema-less stand-in), TrainJobs checked strictly against it when
the client asks (dry runs included), the validating webhook's refusals as 403 Forbidden (runtime
missing or not a Trainer runtime, reserved ``PET_*`` env, env in a patch of ``node``), and the
controller, JobSet and Job controller together: one pod per node named
``<job>-node-0-<index>-<5 random>`` with JobSet's labels and the completion-index annotation, the
container ``node`` built from the runtime, ``spec.trainer`` and ``runtimePatches``, the torch
plugin's ``PET_*`` upserted after the user's env, ``status.jobsStatus`` (counts of child Jobs) and
the conditions ``Complete``/``Failed``. A JobSet that cannot be built (a pod name over 63
characters) sets no condition, only Warning events ``TrainJobResourcesCreationFailed``.

The Job controller's side of a lost pod (an Indexed Job, restartPolicy OnFailure): a pod of a TrainJob
not finished that leaves the store without having succeeded (deleted, its node lost) gets a replacement
at once (``podReplacementPolicy`` TerminatingOrFailed, the default: it does not wait for the old pod's
processes), with a new name (a new random suffix) and uid, the same completion index (annotation and
label ``batch.kubernetes.io/job-completion-index``, env ``JOB_COMPLETION_INDEX``, ``PET_NODE_RANK``)
and an empty log; the deleted pod counts as one of the Job's failed pods, and one more than the
backoff limit fails the TrainJob. A succeeded index is not run again. Nothing is replaced once the
TrainJob is Complete or Failed, nor after it was deleted or its pods went by ``delete_pods`` (its
owner gone: garbage collection).

Same deviations as the PyTorchJob operator (see fake_apiserver): ``PET_MASTER_ADDR`` reaches the
process as 127.0.0.1 and the port is a free local one; ``Pod.injected_env`` keeps the real values.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_apiserver import CRD_PATH, Pod, _read_crd, free_port, invalid_obj, match_labels, now, status_obj

from launcher.targets.k8s.validation.schema import strict_schema, version_schema
from launcher.targets.k8s.validation.trainjob_rules import validate_trainjob

PATH = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?$")
CRD_NAME = "trainjobs.trainer.kubeflow.org"
WEBHOOK = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request'
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
MASTER_PORT = 29500
# The default runtime as the Helm chart installs it (torch-distributed.helm.yaml, without templating).
TORCH_DISTRIBUTED = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [{
        "name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                     "spec": {"template": {"spec": {"containers": [
                                         {"name": "node", "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]}}}}}]}}},
}
STAND_IN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": CRD_NAME},
    "spec": {"group": "trainer.kubeflow.org", "scope": "Namespaced",
             "names": {"kind": "TrainJob", "listKind": "TrainJobList", "plural": "trainjobs", "singular": "trainjob"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def installed_crd() -> dict:
    path = os.environ.get("DDPJOB_TRAINJOB_CRD")
    if path and Path(path).is_file():
        return json.loads(_read_crd(path))
    return json.loads(json.dumps(STAND_IN_CRD))


@dataclass
class ChildJob:
    """What the Job ``<trainjob>-node-0`` keeps of its pods: its failed count (deleted pods) and the
    completion indexes that succeeded."""

    failed: int = 0
    succeeded: set[int] = field(default_factory=set)


class Trainer:
    """Trainer v2 in a ``FakeCluster`` (its lock guards everything here). Knobs for tests:
    ``installed`` (False: no TrainJob API, no CRD), ``runtimes`` (ClusterTrainingRuntimes by name),
    ``backoff_limit`` (the Job's; Kubernetes' default 6), ``restart_delay`` (the kubelet's back-off; 0: at once),
    ``creation_failure``, ``crd``."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.jobs: dict[tuple[str, str], dict] = {}
        self.installed = True
        self.crd = installed_crd()
        self.runtimes: dict[str, dict] = {"torch-distributed": json.loads(json.dumps(TORCH_DISTRIBUTED))}
        self.backoff_limit = 6
        self.restart_delay = 0.0  # the kubelet's back-off before a failed container restarts (real: 10 s, doubling)
        self.creation_failure: str | None = None  # set: the JobSet cannot be built (e.g. the runtime was deleted)
        self.children: dict[str, ChildJob] = {}  # TrainJob uid -> its Job's pod counts
        self._strict: tuple[str, dict] | None = None

    def job(self, name: str, namespace: str = "default") -> dict | None:
        with self.cluster.lock:
            return self.jobs.get((namespace, name))

    def strict(self) -> dict:
        key = json.dumps(self.crd, sort_keys=True)
        if self._strict is None or self._strict[0] != key:
            self._strict = (key, strict_schema(version_schema(self.crd, "v1alpha1")))
        return self._strict[1]

    # ---------------------------------------------------------------- HTTP
    def handle(self, h: Any, method: str, path: str, query: dict, body: Any) -> bool:
        """Answer a request that is Trainer's; False if it is not."""
        m = CRD_PATH.match(path)
        if m and m.group(1) == CRD_NAME and method == "GET":
            if not self.installed:
                h._send(404, status_obj(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io "{CRD_NAME}" not found',
                                        {"name": CRD_NAME, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"}))
            else:
                h._send(200, self.crd)
            return True
        m = PATH.match(path)
        if not m:
            return False
        if not self.installed:
            h._send(404, "404 page not found\n", "text/plain")
            return True
        ns, name = m.group(1), m.group(2)
        if method == "POST" and name is None:
            self._create(h, ns, query, body)
        elif method == "GET" and name is None:
            with self.cluster.lock:
                items = [j for (jns, _), j in self.jobs.items()
                         if jns == ns and match_labels(j["metadata"].get("labels", {}), query.get("labelSelector"))]
                data = json.loads(json.dumps(items))
            h._send(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJobList", "metadata": {}, "items": data})
        else:
            with self.cluster.lock:
                job = self.jobs.get((ns, name))
                data = json.loads(json.dumps(job)) if job else None
            if data is None:
                h._send(404, status_obj(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found',
                                        {"name": name, "group": "trainer.kubeflow.org", "kind": "trainjobs"}))
            elif method == "GET":
                h._send(200, data)
            elif method == "DELETE":
                with self.cluster.lock:  # ownerReferences: JobSet -> Jobs -> pods go with it
                    self.cluster.delete_pods(name, ns)
                    self.jobs.pop((ns, name), None)
                h._send(200, status_obj(200, "", "", {"name": name, "group": "trainer.kubeflow.org", "kind": "trainjobs"}))
            else:
                h._send(405, status_obj(405, "MethodNotAllowed", "method not allowed"))
        return True

    def _create(self, h: Any, ns: str, query: dict, body: dict) -> None:
        name = (body.get("metadata") or {}).get("name", "")
        if query.get("fieldValidation") == "Strict":
            issues = validate_trainjob(body, self.strict())
            if issues:
                return h._send(422, invalid_obj("TrainJob", "trainer.kubeflow.org", name, issues))
        denied = self._webhook(ns, body)
        if denied:
            return h._send(403, status_obj(403, "Forbidden", f"{WEBHOOK}: {denied}", {}))
        with self.cluster.lock:
            if (ns, name) in self.jobs:
                return h._send(409, status_obj(409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{name}" already exists',
                                               {"name": name, "group": "trainer.kubeflow.org", "kind": "trainjobs"}))
            stored = json.loads(json.dumps(body))
            stored["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion="1")
            stored["spec"]["runtimeRef"].setdefault("apiGroup", "trainer.kubeflow.org")
            stored["spec"]["runtimeRef"].setdefault("kind", "ClusterTrainingRuntime")
            stored["spec"].setdefault("managedBy", "trainer.kubeflow.org/trainjob-controller")
            for patch in stored["spec"].get("runtimePatches") or []:
                patch.setdefault("time", now())  # stamped by the mutating webhook
            if query.get("dryRun") != "All":
                self.jobs[(ns, name)] = stored
        h._send(201, stored)

    def _webhook(self, ns: str, body: dict) -> str | None:
        spec = body.get("spec") or {}
        ref = spec.get("runtimeRef") or {}
        if ref.get("apiGroup", "trainer.kubeflow.org") != "trainer.kubeflow.org" or \
                ref.get("kind", "ClusterTrainingRuntime") not in ("ClusterTrainingRuntime", "TrainingRuntime"):
            return "spec.runtimeRef: Unsupported value: unsupported runtime"
        if ref.get("kind", "ClusterTrainingRuntime") != "ClusterTrainingRuntime" or ref.get("name") not in self.runtimes:
            return (f'spec.runtimeRef: Invalid value: {ref.get("kind", "ClusterTrainingRuntime")}/{ref.get("name")}: '
                    "must be created before the TrainJob is created")
        reserved = [e.get("name") for e in (spec.get("trainer") or {}).get("env") or []
                    if e.get("name") in ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")]
        if reserved:
            return f"spec.trainer.env: Invalid value: {reserved}: must not have reserved envs"
        return None

    # ---------------------------------------------------------------- controller + JobSet + Job
    def reconcile(self) -> None:
        for (ns, name), job in list(self.jobs.items()):
            status = job.setdefault("status", {})
            if _terminal(job):
                continue
            if "jobsStatus" not in status:
                longest = f"{name}-node-0-{max(0, self._nodes(job) - 1)}-xxxxx"
                if self.creation_failure:
                    self._warn(ns, name, "TrainJobResourcesCreationFailed",
                               f"TrainJob resources reconciliation failed: {self.creation_failure}")
                    continue
                if len(longest) > 63:
                    self._warn(ns, name, "TrainJobResourcesCreationFailed",
                               f"TrainJob resources reconciliation failed: JobSet.jobset.x-k8s.io \"{name}\" is invalid: "
                               f"spec.replicatedJobs[0].name: Invalid value: \"node\": pod names would exceed 63 characters")
                    continue
                self._create_pods(ns, name, job)
            self._step(ns, name, job)

    def _nodes(self, job: dict) -> int:
        trainer = job["spec"].get("trainer") or {}
        runtime = self.runtimes[job["spec"]["runtimeRef"]["name"]]
        return int(trainer.get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes", 1))

    def _warn(self, ns: str, name: str, reason: str, message: str) -> None:
        c = self.cluster
        if any(e["involvedObject"]["name"] == name and e["reason"] == reason for e in c.events):
            return
        ev = c._event(ns, name, "Warning", reason, message)
        ev["involvedObject"]["kind"] = "TrainJob"
        c.events.append(ev)

    def _create_pods(self, ns: str, name: str, job: dict) -> None:
        """The JobSet and its Job at the TrainJob's first reconcile: the job's free local port, one pod per node."""
        self.cluster.ports[(ns, name)] = free_port()
        job["status"]["jobsStatus"] = [{"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}]
        for index in range(self._nodes(job)):
            self._add_pod(self._node_pod(ns, name, job, index))

    def _add_pod(self, pod: Pod) -> None:
        c = self.cluster
        c.pods[(pod.namespace, pod.name)] = pod
        c.events.append(c._event(pod.namespace, pod.name, "Normal", "SuccessfulCreate", f"Created pod: {pod.name}"))

    def _node_pod(self, ns: str, name: str, job: dict, index: int) -> Pod:
        """The pod of completion index ``index`` as JobSet's template and the Job controller make it: at the
        TrainJob's start and for a lost pod's replacement alike (a new name, the same index)."""
        c = self.cluster
        spec = job["spec"]
        trainer = spec.get("trainer") or {}
        runtime = self.runtimes[spec["runtimeRef"]["name"]]
        rjob = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
        pod_tmpl = json.loads(json.dumps(rjob["template"]["spec"]["template"]))
        container = next(x for x in pod_tmpl["spec"]["containers"] if x["name"] == "node")
        meta: dict[str, Any] = {"labels": {}, "annotations": {}}
        for patch in spec.get("runtimePatches") or []:  # strategic merge, in list order
            for prj in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
                ptmpl = ((prj.get("template") or {}).get("spec") or {}).get("template") or {}
                for key in ("labels", "annotations"):
                    meta[key].update((ptmpl.get("metadata") or {}).get(key) or {})
                pspec = ptmpl.get("spec") or {}
                for key, value in pspec.items():
                    if key != "containers":
                        pod_tmpl["spec"][key] = value
                for pc in pspec.get("containers") or []:
                    if pc.get("name") == "node":
                        container.setdefault("volumeMounts", []).extend(pc.get("volumeMounts") or [])
        nodes = self._nodes(job)
        for key in ("image", "command", "args"):
            if key in trainer:
                container[key] = trainer[key]
        env = {e["name"]: e for e in container.get("env") or []}
        env.update({e["name"]: e for e in trainer.get("env") or []})
        if "resourcesPerNode" in trainer:
            container["resources"] = trainer["resourcesPerNode"]
        nproc = trainer.get("numProcPerNode")
        if nproc is None:
            res = container.get("resources") or {}
            gpu = any("gpu" in k for part in res.values() for k in part)
            nproc = "auto" if gpu else 1
        injected = {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc),
                    "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": str(MASTER_PORT)}
        penv = dict(env)
        for k, v in injected.items():
            penv[k] = {"name": k, "value": v}
        by_index = {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
        penv["PET_NODE_RANK"] = {"name": "PET_NODE_RANK", **by_index}
        penv.setdefault("JOB_COMPLETION_INDEX", {"name": "JOB_COMPLETION_INDEX", **by_index})  # the Job controller's
        pc = {**container, "env": list(penv.values()), "ports": [{"containerPort": MASTER_PORT, "protocol": "TCP"}]}
        labels = {**meta["labels"], JOBSET_NAME: name, "jobset.sigs.k8s.io/replicatedjob-name": "node",
                  "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/job-global-index": "0",
                  "jobset.sigs.k8s.io/restart-attempt": "0", "batch.kubernetes.io/job-name": f"{name}-node-0",
                  COMPLETION_INDEX: str(index)}
        pod_name = f"{name}-node-0-{index}-{''.join(random.choices(string.ascii_lowercase + string.digits, k=5))}"
        pod = Pod(pod_name, ns, name, "Node", index, labels, pc, "OnFailure",
                  {**injected, "PET_NODE_RANK": str(index)}, time.monotonic() + c.pod_start_delay)
        pod.container_name = "node"
        pod.annotations = {**meta["annotations"], COMPLETION_INDEX: str(index)}
        empty = {v["name"] for v in pod_tmpl["spec"].get("volumes") or [] if "emptyDir" in v}
        for m in container.get("volumeMounts") or []:
            if m["name"] in empty and m["mountPath"] != "/dev/shm":  # a new pod's emptyDir is a new, empty one
                folder = c.workdir / pod_name / "volumes" / m["name"]
                folder.mkdir(parents=True, exist_ok=True)
                pod.empty_dirs[m["mountPath"].rstrip("/")] = str(folder)
        return pod

    def _replace_missing(self, ns: str, name: str, job: dict) -> ChildJob:
        """The Job controller: a completion index not succeeded whose pod is gone (deleted, its node lost)
        gets a new pod at once; the gone pod counts as failed, and past the backoff limit nothing is
        replaced (the Job fails: ``_step``). Not for a TrainJob whose pods went by ``delete_pods``."""
        c = self.cluster
        uid = job["metadata"]["uid"]
        child = self.children.setdefault(uid, ChildJob())
        if uid in c._collected:
            return child
        have = {p.index for p in c.pods.values() if p.job == name and p.namespace == ns}
        for index in range(self._nodes(job)):
            if index in have or index in child.succeeded:
                continue
            child.failed += 1
            if child.failed > self.backoff_limit:
                break
            self._add_pod(self._node_pod(ns, name, job, index))
        return child

    def _step(self, ns: str, name: str, job: dict) -> None:
        c = self.cluster
        child = self._replace_missing(ns, name, job)
        pods = [p for p in c.pods.values() if p.job == name and p.namespace == ns]
        for pod in pods:
            if pod.phase == "Pending" and time.monotonic() >= pod.start_at:
                c._start(pod)
            elif pod.phase == "Pending" and c.unschedulable_message and not any(
                    e["involvedObject"]["name"] == pod.name and e["reason"] == "FailedScheduling" for e in c.events):
                c.events.append(c._event(ns, pod.name, "Warning", "FailedScheduling", c.unschedulable_message))
            elif (code := pod.ended()) is not None:
                pod.exit_code = code
                if pod.exit_code == 0:
                    pod.phase = "Succeeded"
                    child.succeeded.add(pod.index)
                elif pod.restarts + 1 > self.backoff_limit:  # the Job's backoff limit: the Job fails
                    pod.phase = "Failed"
                else:
                    with pod.cond:
                        pod.previous_log = bytes(pod.log)
                        pod.log = bytearray()
                    pod.restarts += 1
                    pod.last_exit = pod.exit_code
                    if self.restart_delay:  # the kubelet's back-off: the container waits, the pod stays Running
                        pod.proc, pod.waiting_until = None, time.monotonic() + self.restart_delay
                    else:
                        c._start(pod)
            elif pod.waiting_until is not None and time.monotonic() >= pod.waiting_until:
                pod.waiting_until = None
                c._start(pod)
        if not pods and child.failed <= self.backoff_limit:
            return
        nodes = self._nodes(job)
        ready = sum(p.phase in ("Running", "Succeeded") for p in pods) >= nodes
        st = {"name": "node", "active": int(any(p.phase in ("Pending", "Running") for p in pods)), "ready": int(ready),
              "succeeded": int(len(child.succeeded) >= nodes),
              "failed": int(any(p.phase == "Failed" for p in pods) or child.failed > self.backoff_limit), "suspended": 0}
        job["status"]["jobsStatus"] = [st]
        if st["failed"]:
            _condition(job, "Failed", "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {name}-node-0)")
            for key, pod in list(c.pods.items()):  # the JobSet deletes its still-active Jobs (and their pods)
                if pod.job == name and pod.namespace == ns and pod.phase in ("Pending", "Running"):
                    c._kill(pod)
                    del c.pods[key]
        elif st["succeeded"]:
            _condition(job, "Complete", "AllJobsCompleted", "jobset completed successfully")


def _terminal(job: dict) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in job.get("status", {}).get("conditions", []))


def _condition(job: dict, ctype: str, reason: str, message: str) -> None:
    conds = job["status"].setdefault("conditions", [])
    conds.append({"type": ctype, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now()})
    job["status"]["jobsStatus"][0]["active"] = 0
