"""A loopback Kubernetes API server that also plays the Kubeflow training operator (test code only).

The real ``kubernetes`` Python client talks to it over HTTP (or HTTPS, ``start(tls=True)``, as
a pod's service account needs). It serves the installed PyTorchJob CRD on the apiextensions
endpoint (``FakeCluster.crd``: the upstream CRD from ``$DDPJOB_PYTORCHJOB_CRD``, else a stand-in
whose schema accepts any object; ``crd_installed = False``: no CRD and no PyTorchJob API), stores
PyTorchJobs (checked strictly against that CRD when the client asks for ``fieldValidation=Strict``,
dry runs included), answers with real ``Status`` objects (403, 404, 409, 422), and reconciles jobs as the operator does
(shared/reference/kubeflow/CONTRACT.md): one pod per replica named ``<job>-<type>-<index>`` with
the operator's labels, the operator's environment appended after the user's (last wins),
``$(VAR)`` references expanded as the kubelet does, conditions Created -> Running -> Succeeded /
Failed / Restarting, restart in place for OnFailure (previous logs kept), for ExitCode a pod whose
container exited 128 or more (killed) deleted and recreated under its name and one that exited 1-127
failing the job, pod cleanup by
``runPolicy.cleanPodPolicy``, and a missing pod of a job not finished recreated under its name
(``ReconcilePods``: same index, labels and env, a new uid and an empty log; the job Restarting until
it runs, then Running). A pod can be deleted through the API (``DELETE .../pods/NAME`` with
``gracePeriodSeconds``, default 30: SIGTERM to its main process, SIGKILL to every process of it once
the grace period is over) or by ``FakeCluster.delete_pod(name, grace_s=0.0)`` (a node lost for good).
Each pod's command runs as a local process; its output is the log.
It also plays Kubeflow Trainer v2 for TrainJobs (``FakeCluster.trainer``, tests/k8s/fake_trainer.py).

Deviations, because every "pod" shares this machine's network and filesystem:
- ``MASTER_ADDR``/``PET_MASTER_ADDR`` given to the process are ``127.0.0.1`` instead of
  ``<job>-master-0`` (no cluster DNS here), and the master port is remapped to a free local port
  per job (pods share one network namespace). ``Pod.injected_env`` records what the real operator
  injects, so tests can assert the exact values. Likewise the pod runner's ``DDPJOB_WATCH_PORT``
  (one free port per job for its first pod, one per pod for the others: every pod's runner serves its
  stacks there); the pod proxy (``pods/NAME:PORT/proxy/PATH``) forwards the pod's port as declared in
  its env to that local port.
- Images are not pulled; the process runs with this machine's Python. Volumes are not mounted; an
  ``emptyDir`` volume (``Pod.empty_dirs``) is a folder of the pod's own here, which outlives its
  restarts as an emptyDir outlives the container, and an env value under its mount path is
  rewritten to that folder.
- A deleted pod leaves the store at once (no ``Terminating`` object with a ``deletionTimestamp`` to
  read during its grace period; the DELETE answers with it, stamped); the operator still waits for
  its processes to be gone before it recreates the pod, as the real name is taken until then.
  ``delete_pods(job)`` (garbage collection) means the job is gone too: its pods are never recreated.
- No image filesystem: by default every pod shares this machine's. With
  ``FakeCluster.own_filesystems = True`` each pod gets a folder of its own,
  ``<workdir>/<pod name>-<uid[:8]>/fs`` (``Pod.fs_root``): an env value equal to or under the image's
  ``/workspace`` (ddpjob's default output dir ``/workspace/outputs/<id>``) and a ``workingDir`` under
  it are rewritten into it, and its ``/tmp`` (``TMPDIR``) is there; a recreated pod (a new uid) starts
  with an empty one, as a new container does. A restart in place keeps the folder, where a real
  restarted container gets a fresh writable layer (ddpjob's pod runner never lets its container
  restart; an emptyDir is the way to keep files across restarts).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import yaml
from testkit import descendants

from launcher.core.errors import dotted_path as dotted
from launcher.targets.k8s.validation.schema import strict_schema, validate_pytorchjob, version_schema
from launcher.targets.shared.procs import alive, start_time

CRD_PATH = re.compile(r"^/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions/([^/]+)$")
GROUP_PATH = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/pytorchjobs(?:/([^/]+))?$")
POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/log)?)?$")
EVENT_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
PROXY_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+)(?::(\d+))?/proxy(/.*)?$")
OPERATOR = "pytorchjob-controller"


# An operator installed with a schema-less CRD: what the loopback server holds when the upstream
# CRD is not at hand (a fresh clone), so that everything but the strict schema still runs.
STAND_IN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"group": "kubeflow.org", "scope": "Namespaced",
             "names": {"kind": "PyTorchJob", "listKind": "PyTorchJobList", "plural": "pytorchjobs", "singular": "pytorchjob"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@functools.lru_cache(maxsize=4)
def _read_crd(path: str) -> str:
    return json.dumps(yaml.load(Path(path).read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def installed_crd() -> dict:
    """The CRD a fresh loopback cluster holds: the upstream one when the tests have it."""
    path = os.environ.get("DDPJOB_PYTORCHJOB_CRD")
    if path and Path(path).is_file():
        return json.loads(_read_crd(path))
    return json.loads(json.dumps(STAND_IN_CRD))


@functools.lru_cache(maxsize=4)
def _upstream_strict(path: str) -> str:
    return json.dumps(strict_schema(version_schema(json.loads(_read_crd(path)), "v1")))


def upstream_schema() -> dict:
    """The upstream CRD's v1 schema made strict (tests marked ``needs_crd``)."""
    path = os.environ.get("DDPJOB_PYTORCHJOB_CRD")
    assert path and Path(path).is_file(), "needs the upstream PyTorchJob CRD (DDPJOB_PYTORCHJOB_CRD)"
    return json.loads(_upstream_strict(path))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_obj(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "details": details or {}, "code": code}


def invalid_obj(kind: str, group: str, name: str, issues: list) -> dict:
    """The API server's 422 for an object that breaks its CRD (one cause per issue)."""
    causes = [{"reason": "FieldValueInvalid", "message": i.message, "field": dotted(i.path)} for i in issues]
    msg = f'{kind}.{group} "{name}" is invalid: ' + ", ".join(f"{dotted(i.path)}: {i.message}" for i in issues)
    return status_obj(422, "Invalid", msg, {"name": name, "group": group, "kind": kind, "causes": causes})


def watch_key(pod: Pod) -> tuple[str, str]:
    """Where ``FakeCluster.watch_ports`` keeps a pod's local DDPJOB_WATCH_PORT: its job's for the first pod (a
    PyTorchJob's Master, a TrainJob's index 0: the one whose watch.json status reads), its own for the others."""
    first = pod.rtype == "Master" or (pod.rtype == "Node" and pod.index == 0)
    return (pod.namespace, pod.job) if first else (pod.namespace, pod.name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expand_refs(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined names replaced, ``$$`` -> ``$``, others kept."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i):
            end = text.find(")", i + 2)
            name = text[i + 2 : end] if end != -1 else None
            if name is not None and name in env:
                out.append(env[name])
                i = end + 1
            else:
                out.append("$(")
                i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def field_value(pod: Pod, path: str) -> str:
    """The kubelet's ``fieldRef``: the pod's name, namespace, or one of its labels or annotations by key."""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (pod.labels if m.group(1) == "labels" else pod.annotations).get(m.group(2), "")
    return {"metadata.name": pod.name, "metadata.namespace": pod.namespace}.get(path, "")


def under(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it."""
    return path == root or path.startswith(root + "/")


def match_labels(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


@dataclass
class Fault:
    """An injected answer (``FakeCluster.fail_next``)."""

    method: str
    path: re.Pattern[str]
    code: int
    times: int
    causes: list[dict]
    skip: int = 0


@dataclass
class Pod:
    name: str
    namespace: str
    job: str
    rtype: str
    index: int
    labels: dict[str, str]
    container: dict[str, Any]
    restart_policy: str
    injected_env: dict[str, str]
    start_at: float
    phase: str = "Pending"
    proc: subprocess.Popen | None = None
    log: bytearray = field(default_factory=bytearray)
    previous_log: bytes | None = None
    restarts: int = 0
    exit_code: int | None = None
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: str = field(default_factory=now)
    cond: threading.Condition = field(default_factory=threading.Condition)
    container_name: str = "pytorch"  # a TrainJob's pods run the runtime's container `node`
    annotations: dict[str, str] = field(default_factory=dict)
    empty_dirs: dict[str, str] = field(default_factory=dict)  # an emptyDir's mount path -> the pod's own folder
    waiting_until: float | None = None  # restarting after a back-off (CrashLoopBackOff): Trainer.restart_delay
    last_exit: int | None = None  # the previous container's exit code (the pod's lastState), once restarted
    fs_root: str | None = None  # FakeCluster.own_filesystems: this pod's own root; the image's /workspace is under it
    replica_policy: str = ""  # the replica's restartPolicy (ExitCode: the pod's is Never, the operator reads the code)

    def ended(self) -> int | None:
        """The exit code of the container that ran and has ended, as a container reports it (killed by
        signal n: 128 + n); None while it runs or has not started."""
        if self.phase != "Running" or self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def to_json(self) -> dict:
        state: dict[str, Any]
        if self.phase == "Pending":
            state = {"waiting": {"reason": "ContainerCreating"}}
        elif self.phase == "Running" and self.waiting_until is not None:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}}
        elif self.phase == "Running":
            state = {"running": {"startedAt": self.created}}
        else:
            state = {"terminated": {"exitCode": self.exit_code if self.exit_code is not None else 0,
                                    "reason": "Completed" if self.exit_code == 0 else "Error",
                                    "startedAt": self.created, "finishedAt": now()}}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels, "uid": self.uid,
                         "creationTimestamp": self.created, **({"annotations": self.annotations} if self.annotations else {})},
            "spec": {"containers": [self.container], "restartPolicy": self.restart_policy},
            "status": {"phase": self.phase, "startTime": self.created,
                       "containerStatuses": [{"name": self.container_name, "image": self.container.get("image", ""),
                                              "imageID": "", "ready": "running" in state,
                                              "restartCount": self.restarts, "state": state,
                                              **({"lastState": {"terminated": {"exitCode": self.last_exit,
                                                                               "reason": "Error"}}}
                                                 if self.last_exit is not None else {})}]},
        }


class FakeCluster:
    """State of the fake cluster plus the knobs tests use (faults, delays, pod deletion)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.lock = threading.RLock()
        self.jobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.events: list[dict] = []
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, str]] = {}
        self.requests: list[dict] = []
        self.faults: list[Fault] = []
        self.crd_installed = True
        self.crd: dict = installed_crd()
        self._strict: tuple[str, dict] | None = None
        self.pod_start_delay = 0.0
        self.unschedulable_message: str | None = None
        self.ports: dict[tuple[str, str], int] = {}
        # the pod runner's DDPJOB_WATCH_PORT, remapped: (namespace, job) for its first pod, (namespace, pod) the others
        self.watch_ports: dict[tuple[str, str], int] = {}
        self.own_filesystems = False  # True: each pod its own /workspace (Pod.fs_root), a recreated pod a fresh one
        self.terminating: dict[tuple[str, str], Pod] = {}  # deleted pods in their grace period (processes not yet gone)
        self._collected: set[str] = set()  # uids of PyTorchJobs whose pods went by delete_pods: never recreated
        self._recreated: dict[str, set[str]] = {}  # job uid -> names of pods recreated and not yet running
        self._stop = threading.Event()
        from fake_trainer import Trainer  # Kubeflow Trainer v2: TrainJobs (a module of its own)

        self.trainer = Trainer(self)

    # ---------------------------------------------------------------- knobs for tests
    def fail_next(self, method: str, path_regex: str, code: int, times: int = 1, causes: list[dict] | None = None,
                  skip: int = 0) -> None:
        """After ``skip`` matching requests pass, the next ``times`` get ``code``; a 422 carries
        ``causes`` ({field, message})."""
        self.faults.append(Fault(method.upper(), re.compile(path_regex), code, times, causes or [], skip))

    def strict(self) -> dict:
        """The installed CRD's v1 schema, made strict as the API server applies it (cached per CRD)."""
        key = json.dumps(self.crd, sort_keys=True)
        if self._strict is None or self._strict[0] != key:
            self._strict = (key, strict_schema(version_schema(self.crd, "v1")))
        return self._strict[1]

    def add_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.secrets[(namespace, name)] = data

    def add_configmap(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.configmaps[(namespace, name)] = data

    def delete_pods(self, job: str, namespace: str = "default") -> None:
        """What garbage collection or a TTL does: the pods (and their logs) are gone. The job's
        owner is taken to be gone with them, so the operator never recreates them (finished or not)."""
        with self.lock:
            for stored in (self.jobs.get((namespace, job)), self.trainer.jobs.get((namespace, job))):
                if stored is not None:
                    self._collected.add(stored["metadata"]["uid"])
            for key, pod in list(self.pods.items()):
                if pod.job == job and pod.namespace == namespace:
                    self._kill(pod)
                    del self.pods[key]

    def delete_pod(self, name: str, namespace: str = "default", grace_s: float = 0.0) -> dict | None:
        """``kubectl delete pod NAME --grace-period=grace_s``: the pod leaves the store at once (its
        object, as last seen, is returned; None: no such pod); its main process gets SIGTERM and,
        ``grace_s`` later (0: at once, a node lost for good), every process of the pod SIGKILL, in a
        thread of its own. The operator recreates a missing pod of a running PyTorchJob under the
        same name once the old pod's processes are gone (as the API server frees the name only then)."""
        with self.lock:
            pod = self.pods.pop((namespace, name), None)
            if pod is None:
                return None
            obj = pod.to_json()
            obj["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=int(grace_s))
            self.events.append(self._event(namespace, name, "Normal", "Killing", f"Stopping container {pod.container_name}"))
            proc = pod.proc
            if grace_s <= 0 or proc is None or proc.poll() is not None:
                self._kill(pod)
                self._kill_leftovers(proc, {})
                return obj
            self.terminating[(namespace, name)] = pod
            seen = {pid: start_time(pid) for pid in descendants(proc.pid)}
            try:
                os.kill(proc.pid, signal.SIGTERM)  # the kubelet signals the container's main process
            except ProcessLookupError:
                pass
        threading.Thread(target=self._grace, args=(pod, proc, seen, grace_s), daemon=True).start()
        return obj

    def _grace(self, pod: Pod, proc: subprocess.Popen, seen: dict[int, int | None], grace_s: float) -> None:
        """A deleted pod's grace period: its processes may end on SIGTERM; what is left after
        ``grace_s`` is SIGKILLed, also the processes the main one left behind (the container's PID
        namespace goes with it)."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and proc.poll() is None:
            for pid in descendants(proc.pid):
                seen.setdefault(pid, start_time(pid))
            time.sleep(0.05)
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                seen.setdefault(pid, start_time(pid))
        self._kill(pod)
        self._kill_leftovers(proc, seen)
        with self.lock:
            key = (pod.namespace, pod.name)
            if self.terminating.get(key) is pod:
                del self.terminating[key]

    @staticmethod
    def _kill_leftovers(proc: subprocess.Popen | None, seen: dict[int, int | None]) -> None:
        """SIGKILL what is left of a pod whose main process is gone: its process group and the
        processes recorded in ``seen`` (pid -> start time, so that a reused pid is spared)."""
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid, started in seen.items():
            if started is not None and alive(pid, started):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait()

    def pods_of(self, job: str, namespace: str = "default") -> list[Pod]:
        with self.lock:
            return [p for p in self.pods.values() if p.job == job and p.namespace == namespace]

    def job(self, name: str, namespace: str = "default") -> dict | None:
        with self.lock:
            return self.jobs.get((namespace, name))

    def requests_to(self, path_fragment: str) -> list[dict]:
        return [r for r in self.requests if path_fragment in r["path"]]

    # ---------------------------------------------------------------- operator
    def reconcile_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as e:  # keep the operator alive; a test will see the job stuck
                print(f"fake operator error: {e!r}", file=sys.stderr)
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            for pod in [*self.pods.values(), *self.terminating.values()]:
                self._kill(pod)

    def reconcile(self) -> None:
        with self.lock:
            if self._stop.is_set():
                return
            for (ns, name), job in list(self.jobs.items()):
                status = job.setdefault("status", {})
                conds = status.setdefault("conditions", [])
                if not conds:
                    self._condition(job, "Created", "PyTorchJob is created.")
                    self._create_pods(ns, name, job)
                if self._terminal(job):
                    self._settle(ns, name)
                    continue
                self._recreate_missing(ns, name, job)
                self._step_pods(ns, name, job)
            self.trainer.reconcile()

    def _settle(self, ns: str, name: str) -> None:
        """The kubelet's part after the operator's has ended: a pod the finished job left running (a
        worker slower than the master) still ends, Succeeded or Failed by its exit code."""
        for pod in self.pods.values():
            if pod.job == name and pod.namespace == ns and (code := pod.ended()) is not None:
                pod.exit_code, pod.phase = code, "Succeeded" if code == 0 else "Failed"

    def _terminal(self, job: dict) -> bool:
        return any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in job["status"]["conditions"])

    def _condition(self, job: dict, ctype: str, message: str) -> None:
        conds = job["status"]["conditions"]
        if ctype in ("Running", "Restarting"):
            other = "Restarting" if ctype == "Running" else "Running"
            conds[:] = [c for c in conds if c["type"] != other]
        if ctype in ("Succeeded", "Failed"):
            for c in conds:
                if c["type"] == "Running":
                    c["status"] = "False"
        for c in conds:
            if c["type"] == ctype:
                if c["status"] != "True":
                    c.update(status="True", lastTransitionTime=now())
                return
        conds.append({"type": ctype, "status": "True", "reason": f"PyTorchJob{ctype}", "message": message,
                      "lastUpdateTime": now(), "lastTransitionTime": now()})
        if ctype in ("Succeeded", "Failed"):
            job["status"]["completionTime"] = now()

    def _create_pods(self, ns: str, name: str, job: dict) -> None:
        """The operator's first reconcile of a job: its free local port, then one pod per replica."""
        self.ports[(ns, name)] = free_port()
        job["status"]["startTime"] = now()
        for rtype, index in self._replicas(job):
            self._add_pod(self._replica_pod(ns, name, job, rtype, index))

    @staticmethod
    def _replicas(job: dict) -> list[tuple[str, int]]:
        specs = job["spec"]["pytorchReplicaSpecs"]
        return [(rtype, index) for rtype in ("Master", "Worker") if specs.get(rtype)
                for index in range(int(specs[rtype].get("replicas", 1)))]

    def _replica_pod(self, ns: str, name: str, job: dict, rtype: str, index: int) -> Pod:
        """One replica's pod as the operator builds it (``createNewPod``): name, labels, the injected
        env; a new uid and creation time, starting after ``pod_start_delay``. At a job's creation and
        for a missing pod's recreation alike."""
        spec = job["spec"]
        replicas = spec["pytorchReplicaSpecs"]
        total = sum(int(r.get("replicas", 1)) for r in replicas.values())
        nproc = str(spec.get("nprocPerNode", "auto"))
        nproc_int = int(nproc) if nproc.isdigit() else 1
        master = replicas.get("Master")
        port = 23456
        if master:
            for c in master["template"]["spec"]["containers"]:
                if c["name"] == "pytorch":
                    for p in c.get("ports", []):
                        if p.get("name") == "pytorchjob-port":
                            port = int(p["containerPort"])
        rs = replicas[rtype]
        tmpl = rs["template"]
        container = next(c for c in tmpl["spec"]["containers"] if c["name"] == "pytorch")
        injected = {"PYTHONUNBUFFERED": "1"}
        if master:
            node_rank = 0 if rtype == "Master" else index + 1
            injected.update({
                "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
                "MASTER_ADDR": f"{name}-master-0", "PET_MASTER_ADDR": f"{name}-master-0",
                "WORLD_SIZE": str(total * nproc_int), "RANK": str(node_rank), "PET_NODE_RANK": str(node_rank),
            })
        injected["PET_NPROC_PER_NODE"] = nproc
        elastic = spec.get("elasticPolicy")
        if elastic:
            lo = elastic.get("minReplicas", total)
            hi = elastic.get("maxReplicas", total)
            injected.update({"PET_RDZV_ENDPOINT": f"{name}-worker-0:{port}",
                             "PET_RDZV_BACKEND": elastic.get("rdzvBackend", "c10d"), "PET_NNODES": f"{lo}:{hi}"})
            if "maxRestarts" in elastic:
                injected["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
        else:
            injected["PET_NNODES"] = str(total)
        labels = {**(tmpl.get("metadata", {}).get("labels") or {}),
                  "training.kubeflow.org/operator-name": OPERATOR, "training.kubeflow.org/job-name": name,
                  "training.kubeflow.org/replica-type": rtype.lower(),
                  "training.kubeflow.org/replica-index": str(index)}
        if rtype == "Master":
            labels["training.kubeflow.org/job-role"] = "master"
        pod_name = f"{name}-{rtype.lower()}-{index}"
        policy = rs.get("restartPolicy", "OnFailure")
        pod = Pod(pod_name, ns, name, rtype, index, labels, container, "Never" if policy == "ExitCode" else policy,
                  injected, time.monotonic() + self.pod_start_delay, replica_policy=policy)
        empty = {v["name"] for v in tmpl["spec"].get("volumes") or [] if "emptyDir" in v}
        for m in container.get("volumeMounts") or []:
            if m["name"] in empty and m["mountPath"] != "/dev/shm":  # a new pod's emptyDir is a new, empty one
                folder = self.workdir / f"{pod_name}-{pod.uid[:8]}" / "volumes" / m["name"]
                folder.mkdir(parents=True, exist_ok=True)
                pod.empty_dirs[m["mountPath"].rstrip("/")] = str(folder)
        self._own_fs(pod)
        return pod

    def _add_pod(self, pod: Pod) -> None:
        self.pods[(pod.namespace, pod.name)] = pod
        self.events.append(self._event(pod.namespace, pod.name, "Normal", "SuccessfulCreatePod", f"Created pod: {pod.name}"))

    def _recreate_missing(self, ns: str, name: str, job: dict) -> None:
        """``ReconcilePods``: a replica of a job not finished whose pod is missing (deleted, its node
        lost) gets a new one under the same name and index, once the old one's processes are gone;
        the job is Restarting until every recreated pod runs (then Running again, in _step_pods)."""
        uid = job["metadata"]["uid"]
        if uid in self._collected:
            return
        for rtype, index in self._replicas(job):
            pod_name = f"{name}-{rtype.lower()}-{index}"
            if (ns, pod_name) in self.pods or (ns, pod_name) in self.terminating:
                continue
            self._add_pod(self._replica_pod(ns, name, job, rtype, index))
            self._recreated.setdefault(uid, set()).add(pod_name)
            self._condition(job, "Restarting", f"PyTorchJob {name} is restarting because pod {pod_name} is gone; it was recreated.")

    def _own_fs(self, pod: Pod) -> None:
        """``own_filesystems``: the pod's own root, named after its uid, so a recreated pod (a new
        uid) starts with an empty one."""
        if self.own_filesystems and pod.fs_root is None:
            pod.fs_root = str(self.workdir / f"{pod.name}-{pod.uid[:8]}" / "fs")

    def _event(self, ns: str, pod: str, etype: str, reason: str, message: str) -> dict:
        return {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:8]}", "namespace": ns},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": ns}, "reason": reason,
                "message": message, "type": etype, "count": 1, "firstTimestamp": now(), "lastTimestamp": now()}

    def _process_env(self, pod: Pod) -> dict[str, str]:
        env: dict[str, str] = {}
        for ref in pod.container.get("envFrom", []):
            src = ref.get("secretRef") or ref.get("configMapRef") or {}
            store = self.secrets if "secretRef" in ref else self.configmaps
            env.update({ref.get("prefix", "") + k: v for k, v in store.get((pod.namespace, src.get("name")), {}).items()})
        for item in pod.container.get("env", []):
            if "value" in item:
                env[item["name"]] = expand_refs(item["value"], env)
            elif "valueFrom" in item:
                vf = item["valueFrom"]
                if "secretKeyRef" in vf:
                    ref = vf["secretKeyRef"]
                    env[item["name"]] = self.secrets.get((pod.namespace, ref["name"]), {}).get(ref["key"], "")
                elif "configMapKeyRef" in vf:
                    ref = vf["configMapKeyRef"]
                    env[item["name"]] = self.configmaps.get((pod.namespace, ref["name"]), {}).get(ref["key"], "")
                elif "fieldRef" in vf:
                    env[item["name"]] = field_value(pod, vf["fieldRef"]["fieldPath"])
            else:
                env[item["name"]] = ""
        env.update(pod.injected_env)  # the kubelet builds env last-wins: the operator's values win
        for mount, folder in pod.empty_dirs.items():  # deviation: no mounts; the path given is the pod's folder
            env = {k: folder + v[len(mount):] if v == mount or v.startswith(mount + "/") else v for k, v in env.items()}
        if pod.fs_root:  # deviation: no image filesystem; the image's /workspace is the pod's own folder
            env = {k: pod.fs_root + v if under(v, "/workspace") else v for k, v in env.items()}
        # Deviation (see module docstring): one shared network namespace and no cluster DNS.
        local_port = str(self.ports[(pod.namespace, pod.job)])
        for key in ("MASTER_ADDR", "PET_MASTER_ADDR"):
            if key in env:
                env[key] = "127.0.0.1"
        for key in ("MASTER_PORT", "PET_MASTER_PORT"):
            if key in env:
                env[key] = local_port
        if "PET_RDZV_ENDPOINT" in env:
            env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{local_port}"
        if "DDPJOB_WATCH_PORT" in env:
            env["DDPJOB_WATCH_PORT"] = str(self.watch_ports.setdefault(watch_key(pod), free_port()))
        return env

    def _start(self, pod: Pod) -> None:
        self._own_fs(pod)
        env = self._process_env(pod)
        argv = [expand_refs(a, env) for a in pod.container.get("command", []) + pod.container.get("args", [])]
        base = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # each pod its own /tmp, kept with the test's folder (a killed pod's runner leaves its folder
        # there, not in this machine's /tmp); with its own filesystem, in it (fresh for a recreated pod)
        tmp = Path(pod.fs_root) / "tmp" if pod.fs_root else self.workdir / pod.name / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        base["TMPDIR"] = str(tmp)
        cwd = pod.container.get("workingDir")
        if pod.fs_root:
            (Path(pod.fs_root) / "workspace").mkdir(parents=True, exist_ok=True)  # the image's /workspace
            if cwd and under(cwd, "/workspace"):  # the runtime creates a missing workingDir
                cwd = pod.fs_root + cwd
                Path(cwd).mkdir(parents=True, exist_ok=True)
        if not cwd or not Path(cwd).is_dir():
            cwd = str(Path(pod.fs_root).parent if pod.fs_root else self.workdir / pod.name)
            Path(cwd).mkdir(parents=True, exist_ok=True)
        try:
            pod.proc = subprocess.Popen(argv, env={**base, **env}, cwd=cwd, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            pod.log += f"exec failed: {e}\n".encode()
            pod.phase, pod.exit_code = "Failed", 128
            return
        pod.phase = "Running"
        self.events.append(self._event(pod.namespace, pod.name, "Normal", "Started", "Started container pytorch"))
        threading.Thread(target=self._pump, args=(pod, pod.proc), daemon=True).start()

    def _pump(self, pod: Pod, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):
            with pod.cond:
                pod.log += chunk
                pod.cond.notify_all()
        proc.wait()
        with pod.cond:
            pod.cond.notify_all()

    def _step_pods(self, ns: str, name: str, job: dict) -> None:
        pods = [p for p in self.pods.values() if p.job == name and p.namespace == ns]
        run_policy = job["spec"].get("runPolicy", {})
        for pod in pods:
            if pod.phase == "Pending" and time.monotonic() >= pod.start_at:
                self._start(pod)
            elif pod.phase == "Pending" and self.unschedulable_message and not any(
                    e["involvedObject"]["name"] == pod.name and e["reason"] == "FailedScheduling" for e in self.events):
                self.events.append(self._event(ns, pod.name, "Warning", "FailedScheduling", self.unschedulable_message))
            elif (code := pod.ended()) is not None:
                pod.exit_code = code
                if code != 0 and pod.restart_policy in ("OnFailure", "Always"):
                    if pod.restarts + 1 > int(run_policy.get("backoffLimit", 6)):
                        pod.phase = "Failed"
                        self._condition(job, "Failed", f"PyTorchJob {name} has failed because it has reached the specified backoff limit")
                        continue
                    with pod.cond:
                        pod.previous_log = bytes(pod.log)
                        pod.log = bytearray()
                    pod.restarts += 1
                    self._condition(job, "Restarting", f"PyTorchJob {name} is restarting because {pod.name} failed")
                    self._start(pod)
                elif code >= 128 and pod.replica_policy == "ExitCode":  # retryable: deleted, recreated next round
                    pod.phase = "Failed"
                    self.events.append(self._event(ns, pod.name, "Normal", "ExitedWithCode",
                                                   f"Pod: {ns}.{pod.name} exited with code {code}"))
                    self.pods.pop((ns, pod.name), None)
                    self._kill_leftovers(pod.proc, {})
                    self._condition(job, "Restarting", f"PyTorchJob {name} is restarting because {pod.name} exited "
                                    f"with code {code}; it is deleted and recreated.")
                else:
                    pod.phase = "Succeeded" if code == 0 else "Failed"
        pods = [p for p in pods if self.pods.get((ns, p.name)) is p]  # less those ExitCode deleted
        master = [p for p in pods if p.rtype == "Master"]
        recreated = self._recreated.get(job["metadata"]["uid"])
        if recreated is not None:  # recreated pods: Restarting until each has started, then Running again
            recreated -= {p.name for p in pods if p.phase != "Pending"}
            if not recreated and master and master[0].phase == "Running":
                del self._recreated[job["metadata"]["uid"]]
                self._condition(job, "Running", f"PyTorchJob {name} is running.")
        if master and master[0].phase == "Running" and not any(
                c["type"] == "Running" and c["status"] == "True" for c in job["status"]["conditions"]) \
                and not any(c["type"] == "Restarting" for c in job["status"]["conditions"]):
            self._condition(job, "Running", f"PyTorchJob {name} is running.")
        if any(p.phase == "Failed" for p in pods) and not self._terminal(job):
            failed = next(p for p in pods if p.phase == "Failed")
            self._condition(job, "Failed", f"PyTorchJob {name} is failed because 1 {failed.rtype} replica(s) failed.")
        elif master and master[0].phase == "Succeeded":
            self._condition(job, "Succeeded", f"PyTorchJob {name} is successfully completed.")
        job["status"]["replicaStatuses"] = {
            rt: {"active": sum(p.phase == "Running" for p in pods if p.rtype == rt),
                 "succeeded": sum(p.phase == "Succeeded" for p in pods if p.rtype == rt),
                 "failed": sum(p.phase == "Failed" for p in pods if p.rtype == rt),
                 "selector": f"training.kubeflow.org/job-name={name},training.kubeflow.org/operator-name={OPERATOR},"
                             f"training.kubeflow.org/replica-type={rt.lower()}"}
            for rt in job["spec"]["pytorchReplicaSpecs"]
        }
        if self._terminal(job):
            self._clean(ns, name, run_policy.get("cleanPodPolicy", "None"))

    def _clean(self, ns: str, name: str, policy: str) -> None:
        for key, pod in list(self.pods.items()):
            if pod.job != name or pod.namespace != ns:
                continue
            if policy == "All" or (policy == "Running" and pod.phase in ("Running", "Pending")):
                self._kill(pod)
                del self.pods[key]

    def _kill(self, pod: Pod) -> None:
        """A container's end: every process of the pod dies, also those in sessions of their own
        (torchrun starts its workers so), as they do when a container's PID namespace goes."""
        if pod.proc is not None and pod.proc.poll() is None:
            tree = [(pid, start_time(pid)) for pid in descendants(pod.proc.pid)]
            try:
                os.killpg(pod.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for pid, _ in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            pod.proc.wait()
            # A SIGKILLed process is gone a moment later, not at once: the container's end is when they all are.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(alive(pid, started) for pid, started in tree if started):
                time.sleep(0.01)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cluster: FakeCluster

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if content_type == "application/json" else str(body).encode())
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
        c = self.cluster
        c.requests.append({"method": method, "path": url.path, "query": query, "body": body,
                           "authorization": self.headers.get("Authorization")})
        for fault in c.faults:
            if fault.method == method and fault.path.search(url.path) and fault.times > 0:
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                fault.times -= 1
                return self._fault(fault.code, url.path, body, fault.causes)
        if c.trainer.handle(self, method, url.path, query, body):
            return
        m = CRD_PATH.match(url.path)
        if m and method == "GET":
            if not c.crd_installed or m.group(1) != c.crd["metadata"]["name"]:
                return self._send(404, status_obj(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io "{m.group(1)}" not found',
                                                  {"name": m.group(1), "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"}))
            return self._send(200, c.crd)
        m = GROUP_PATH.match(url.path)
        if m:
            if not c.crd_installed:
                return self._send(404, "404 page not found\n", "text/plain")
            return self._jobs(method, m.group(1), m.group(2), query, body)
        m = PROXY_PATH.match(unquote(url.path))
        if m and method == "GET":
            return self._proxy(m.group(1), m.group(2), int(m.group(3) or 80), m.group(4) or "/")
        m = POD_PATH.match(url.path)
        if m and method == "GET":
            return self._pods(m.group(1), m.group(2), bool(m.group(3)), query)
        if m and method == "DELETE" and m.group(2) and not m.group(3):
            return self._delete_pod(m.group(1), m.group(2), query, body)
        m = EVENT_PATH.match(url.path)
        if m and method == "GET":
            sel = query.get("fieldSelector", "")
            want = dict(t.split("=", 1) for t in sel.split(",") if "=" in t)
            with c.lock:
                items = [e for e in c.events if e["metadata"]["namespace"] == m.group(1)
                         and all(e["involvedObject"].get(k.split(".", 1)[1]) == v for k, v in want.items() if k.startswith("involvedObject."))]
            return self._send(200, {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items})
        self._send(404, status_obj(404, "NotFound", "the server could not find the requested resource"))

    def _fault(self, code: int, path: str, body: Any, causes: list[dict] | None = None) -> None:
        name = (body or {}).get("metadata", {}).get("name", path.rsplit("/", 1)[-1]) if isinstance(body, dict) else path.rsplit("/", 1)[-1]
        if code == 403 and "/proxy" in path:
            pod = unquote(path).split("/pods/", 1)[-1].split("/", 1)[0]
            msg = (f'pods "{pod}" is forbidden: User "system:serviceaccount:default:ddpjob" cannot get resource '
                   '"pods/proxy" in API group "" in the namespace "default"')
            return self._send(403, status_obj(403, "Forbidden", msg, {"name": pod, "kind": "pods"}))
        if code == 403:
            verb = {"POST": "create", "GET": "get", "DELETE": "delete"}.get(self.command, "get")
            msg = (f'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:default:ddpjob" cannot {verb} '
                   'resource "pytorchjobs" in API group "kubeflow.org" in the namespace "default"')
            return self._send(403, status_obj(403, "Forbidden", msg, {"group": "kubeflow.org", "kind": "pytorchjobs"}))
        if code == 404:
            return self._send(404, "404 page not found\n", "text/plain")
        if code == 409:
            return self._send(409, status_obj(409, "AlreadyExists", f'pytorchjobs.kubeflow.org "{name}" already exists',
                                              {"name": name, "group": "kubeflow.org", "kind": "pytorchjobs"}))
        if code == 422:
            said = ", ".join(f"{c['field']}: {c['message']}" for c in causes or []) or "spec: Invalid value"
            return self._send(422, status_obj(422, "Invalid", f'PyTorchJob.kubeflow.org "{name}" is invalid: {said}',
                                              {"name": name, "group": "kubeflow.org", "kind": "PyTorchJob",
                                               "causes": [{"reason": "FieldValueInvalid", **c} for c in causes or []]}))
        self._send(code, status_obj(code, "InternalError", "injected failure"))

    def _jobs(self, method: str, ns: str, name: str | None, query: dict, body: Any) -> None:
        c = self.cluster
        if method == "POST" and name is None:
            obj_name = (body.get("metadata") or {}).get("name", "")
            # Strict against the installed CRD (a schema-less stand-in accepts any object; the tests
            # that rely on the upstream schema are marked needs_crd) and the operator's rules.
            if query.get("fieldValidation") == "Strict":
                issues = validate_pytorchjob(body, c.strict())
                if issues:
                    return self._send(422, invalid_obj("PyTorchJob", "kubeflow.org", obj_name, issues))
            with c.lock:
                if (ns, obj_name) in c.jobs:
                    return self._fault(409, "", body)
                stored = json.loads(json.dumps(body))
                stored["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion="1")
                if query.get("dryRun") != "All":
                    c.jobs[(ns, obj_name)] = stored
            return self._send(201, stored)
        if method == "GET" and name is None:
            with c.lock:
                items = [j for (jns, _), j in c.jobs.items() if jns == ns and match_labels(j["metadata"].get("labels", {}), query.get("labelSelector"))]
                data = json.loads(json.dumps(items))
            return self._send(200, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList", "metadata": {}, "items": data})
        with c.lock:
            job = c.jobs.get((ns, name))
            data = json.loads(json.dumps(job)) if job else None
        if data is None:
            return self._send(404, status_obj(404, "NotFound", f'pytorchjobs.kubeflow.org "{name}" not found',
                                              {"name": name, "group": "kubeflow.org", "kind": "pytorchjobs"}))
        if method == "GET":
            return self._send(200, data)
        if method == "DELETE":
            with c.lock:
                c.delete_pods(name, ns)
                c.jobs.pop((ns, name), None)
            return self._send(200, status_obj(200, "", "", {"name": name, "group": "kubeflow.org", "kind": "pytorchjobs"}))
        self._send(405, status_obj(405, "MethodNotAllowed", "method not allowed"))

    def _proxy(self, ns: str, name: str, port: int, path: str) -> None:
        """The API server's pod proxy: GET ``path`` from the pod's ``port`` (its declared
        DDPJOB_WATCH_PORT is the job's local watch port here); 503 as the API server says when
        nothing listens there."""
        c = self.cluster
        with c.lock:
            pod = c.pods.get((ns, name))
        if pod is None:
            return self._send(404, status_obj(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
        declared = next((e.get("value") for e in pod.container.get("env", []) if e.get("name") == "DDPJOB_WATCH_PORT"), None)
        local = c.watch_ports.get(watch_key(pod)) if declared == str(port) else None
        try:
            if local is None:
                raise OSError("connection refused")
            with urllib.request.urlopen(f"http://127.0.0.1:{local}{path}", timeout=10) as resp:
                return self._send(resp.status, resp.read(), resp.headers.get("Content-Type", "text/plain"))
        except urllib.error.HTTPError as e:
            return self._send(e.code, e.read(), e.headers.get("Content-Type", "text/plain"))
        except OSError:
            return self._send(503, status_obj(503, "ServiceUnavailable", f"error trying to reach service: dial tcp "
                                              f"10.0.0.1:{port}: connect: connection refused"))

    def _delete_pod(self, ns: str, name: str, query: dict, body: Any) -> None:
        """``DELETE .../pods/NAME`` (``kubectl delete pod``, ``delete_namespaced_pod``): the
        DeleteOptions from the body when there is one, else from the query, as the API server reads
        them; no ``gracePeriodSeconds``: Kubernetes' default 30 s (the pod spec's
        terminationGracePeriodSeconds is not kept here). 200 with the pod, 404 Status."""
        c = self.cluster
        options = body if isinstance(body, dict) else {
            "gracePeriodSeconds": query.get("gracePeriodSeconds"), "dryRun": [query["dryRun"]] if "dryRun" in query else None}
        grace = options.get("gracePeriodSeconds")
        with c.lock:
            pod = c.pods.get((ns, name))
            if pod is None:
                obj = None
            elif options.get("dryRun") == ["All"]:
                obj = pod.to_json()
            else:
                obj = c.delete_pod(name, ns, float(30 if grace is None else grace))
        if obj is None:
            return self._send(404, status_obj(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
        return self._send(200, obj)

    def _pods(self, ns: str, name: str | None, log: bool, query: dict) -> None:
        c = self.cluster
        if name is None:
            with c.lock:
                items = [p.to_json() for p in c.pods.values() if p.namespace == ns and match_labels(p.labels, query.get("labelSelector"))]
            return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
        with c.lock:
            pod = c.pods.get((ns, name))
        if pod is None:
            return self._send(404, status_obj(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
        if not log:
            return self._send(200, pod.to_json())
        if query.get("previous") == "true":
            if pod.previous_log is None:
                return self._send(400, status_obj(400, "BadRequest", f'previous terminated container "pytorch" in pod "{name}" not found'))
            return self._send(200, pod.previous_log, "text/plain")
        if pod.phase == "Pending":
            return self._send(400, status_obj(400, "BadRequest", f'container "pytorch" in pod "{name}" is waiting to start: ContainerCreating'))
        if query.get("follow") != "true":
            data = bytes(pod.log)
            tail = query.get("tailLines")
            if tail:
                data = b"".join(data.splitlines(keepends=True)[-int(tail):])
            return self._send(200, data, "text/plain")
        # follow: stream with chunked encoding until the container exits
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        current = pod.log
        while True:
            with pod.cond:
                if pod.log is not current:  # restarted in place: this stream ends, as the kubelet's does
                    break
                if len(pod.log) == sent and (pod.proc is None or pod.proc.poll() is not None):
                    break
                if len(pod.log) == sent:
                    pod.cond.wait(timeout=0.2)
                chunk = bytes(pod.log[sent:])
            if chunk:
                sent += len(chunk)
                try:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
            with c.lock:
                if c.pods.get((ns, name)) is not pod:  # deleted (perhaps recreated under its name)
                    break
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


@dataclass
class FakeApiServer:
    cluster: FakeCluster
    url: str
    kubeconfig: Path
    httpd: ThreadingHTTPServer
    ca_cert: Path | None = None

    @property
    def server(self) -> FakeCluster:
        return self.cluster

    def close(self) -> None:
        self.cluster.stop()
        self.httpd.shutdown()
        self.httpd.server_close()


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl), as a cluster's CA would issue one."""
    cert, key = tmp / "apiserver.crt", tmp / "apiserver.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def start(tmp: Path | None = None, *, tls: bool = False) -> FakeApiServer:
    """A running loopback cluster; ``tls``: HTTPS with a self-signed certificate (``.ca_cert``)."""
    tmp = tmp or Path(tempfile.mkdtemp(prefix="fake-k8s-"))
    tmp.mkdir(parents=True, exist_ok=True)
    cluster = FakeCluster(tmp / "pods")
    handler = type("BoundHandler", (Handler,), {"cluster": cluster})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    ca_cert = None
    if tls:
        ca_cert, key = self_signed(tmp)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(ca_cert, key)
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    url = f"{'https' if tls else 'http'}://127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    threading.Thread(target=cluster.reconcile_forever, daemon=True).start()
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "ddpjob-test",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [{"name": "ddpjob-test", "context": {"cluster": "fake", "user": "tester", "namespace": "default"}}],
    }))
    return FakeApiServer(cluster, url, kubeconfig, httpd, ca_cert)


__all__ = ["STAND_IN_CRD", "FakeApiServer", "FakeCluster", "Pod", "descendants", "expand_refs", "installed_crd", "invalid_obj", "start",
           "upstream_schema"]
