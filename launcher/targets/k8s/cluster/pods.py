"""The pods of a PyTorchJob as ``logs`` sees them: which replica (task, node) a pod is, which file
keeps each run of its container under ``pods/``, and a lock so one reader owns a pod's files."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeGuard

from launcher.core.jsondata import JSONObject, arr, integer, obj, text
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi
from launcher.targets.shared.runfolder import LOG_SUFFIX, RunFolder

if TYPE_CHECKING:
    from launcher.core.progress import Progress
    from launcher.targets.k8s.cluster.client import Kube
    from launcher.targets.k8s.payload import K8sHandle

_POD_RE = re.compile(r"^(?P<job>.+)-(?P<type>master|worker)-(?P<index>\d+)$")
# A TrainJob's pods (JobSet, replicatedJob `node`, Job index 0): <job>-node-0-<completion index>-<5 random>.
_NODE_RE = re.compile(r"^(?P<job>.+)-node-0-(?P<index>\d+)-(?P<rand>[a-z0-9]{5})$")


@dataclass(frozen=True)
class PodRef:
    """A pod of one of the job's PyTorchJobs and where its lines come from (task, node)."""

    name: str
    task: int
    node: int
    label: str


class LogStream(Protocol):
    """An open log response (urllib3's, ``Kube.stream_log``) as it is read and closed here."""

    def read(self, amt: int) -> bytes: ...

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


def pod_ref(pod_name: str, elements: Sequence[Mapping[str, object]], multi: bool) -> PodRef | None:
    """Task and node of a pod from its name: ``<job>-master-0`` is node 0, ``<job>-worker-i`` node i+1;
    a TrainJob's ``<job>-node-0-<i>-xxxxx`` is node i (its completion index, which is PET_NODE_RANK).
    ``elements``: each run's ``index`` and object ``name``."""
    m = _POD_RE.match(pod_name)
    if not m:
        n = _NODE_RE.match(pod_name)
        task = _task(elements, n.group("job")) if n else None
        if n is None or task is None:
            return None
        return PodRef(pod_name, task, int(n.group("index")), (f"task{task} " if multi else "") + f"node-{n.group('index')}")
    task = _task(elements, m.group("job"))
    if task is None:
        return None
    index = int(m.group("index"))
    node = 0 if m.group("type") == "master" else index + 1
    label = (f"task{task} " if multi else "") + f"{m.group('type')}-{index}"
    return PodRef(pod_name, task, node, label)


def _task(elements: Sequence[Mapping[str, object]], job: str) -> int | None:
    """The index of the run whose object is ``job``, or None."""
    index = next((e["index"] for e in elements if e["name"] == job), None)
    return index if isinstance(index, int) else None


def name_of(pod: Mapping[str, object]) -> str:
    """An object's ``metadata.name``."""
    return str(obj(pod["metadata"])["name"])


def attempt_file(pods_dir: Path, pod: Mapping[str, object], restarts: int) -> Path:
    meta = obj(pod["metadata"])
    created = re.sub(r"[^0-9TZ]", "", text(meta.get("creationTimestamp")) or "0")
    return pods_dir / name_of(pod) / f"{created}-{(text(meta.get('uid')) or 'nouid')[:8]}-r{restarts:03d}.log"


def path_uid(path: Path, pod: Mapping[str, object]) -> str | None:
    """The pod uid behind an attempt file, if it is this pod's (the name holds its first 8 characters)."""
    uid = text(obj(pod["metadata"]).get("uid"))
    return uid if f"-{uid[:8]}-r" in path.name else None


def container(pod: Mapping[str, object], name: str = PYTORCHJOB.container) -> JSONObject | None:
    for cs in arr(obj(pod.get("status")).get("containerStatuses")):
        if isinstance(cs, dict) and cs.get("name") == name:
            return cs
    return None


def restart_count(cs: Mapping[str, object] | None) -> int:
    """A container status's ``restartCount``, 0 where it has none."""
    return integer((cs or {}).get("restartCount")) or 0


def started(cs: JSONObject | None) -> TypeGuard[JSONObject]:
    """The container has run (or runs): a status that is not None and not still waiting for its first start."""
    if cs is None:
        return False
    state = obj(cs.get("state"))
    return "running" in state or "terminated" in state or restart_count(cs) > 0


def reached(kube: Kube | None) -> Kube:
    """``kube``, through which the pods at hand were listed (None only where the cluster was out of reach)."""
    assert kube is not None
    return kube


class PodLock:
    """An exclusive, non-blocking lock on one pod's log folder (held by whoever persists it)."""

    def __init__(self, pod_dir: Path) -> None:
        pod_dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(pod_dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held = True
        except OSError:
            self.held = False

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def read_chunks(resp: LogStream) -> Iterator[bytes]:
    while True:
        data = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not data:
            return
        yield data


def close(resp: LogStream) -> None:
    """Close a log stream, also while another thread is blocked reading it (Ctrl-C on ``logs -f``):
    the socket is shut down first, so that read returns; closing alone waits for the reader's lock,
    for ever on a quiet stream."""
    import socket

    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    try:
        resp.close()
        resp.release_conn()
    except Exception:  # noqa: BLE001, S110 - best effort
        pass


def sort_key(pod_name: str) -> tuple[str, int, int]:
    m = _POD_RE.match(pod_name)
    if not m:
        n = _NODE_RE.match(pod_name)
        return (n.group("job"), 2, int(n.group("index"))) if n else (pod_name, 0, 0)
    return (m.group("job"), 0 if m.group("type") == "master" else 1, int(m.group("index")))


def pod_nodes(kube: Kube, job_name: str, api: KubeflowApi = PYTORCHJOB) -> tuple[list[dict[str, object]], list[str]]:
    """Per-pod rows for ``status`` and the scheduling events of Pending pods."""
    nodes: list[dict[str, object]] = []
    pending: list[str] = []
    for pod in kube.list_pods(api.pod_selector(job_name)):
        name = name_of(pod)
        ref = pod_ref(name, [{"index": 0, "name": job_name}], False)
        st = obj(pod.get("status"))
        cs = container(pod, api.container) or {}
        row: dict[str, object] = {"node": ref.node if ref else name, "pod": name, "phase": st.get("phase", "?"),
                                  "restarts": cs.get("restartCount", 0)}
        state = obj(cs.get("state"))
        if state.get("terminated"):
            row["exit_code"] = obj(state["terminated"]).get("exitCode")
        if obj(state.get("waiting")).get("reason") and st.get("phase") == "Running":
            row["waiting"] = obj(state["waiting"])["reason"]  # restarting: CrashLoopBackOff
        last = obj(obj(cs.get("lastState")).get("terminated")).get("exitCode")
        if last is not None and not state.get("terminated"):
            row["last_exit_code"] = last  # its previous container's, since restarted
        nodes.append(row)
        if st.get("phase") == "Pending":
            events = [e for e in kube.pod_events(name) if e.get("type") == "Warning" or e.get("reason") == "FailedScheduling"]
            if events:
                e = events[-1]
                pending.append(f"{name} Pending: {e.get('reason')}: {e.get('message')}")
            else:
                pending.append(f"{name} Pending")
    nodes.sort(key=_row_order)
    return nodes, pending


def _row_order(row: Mapping[str, object]) -> tuple[str, int, str]:
    """``status``'s rows in order: by type (the pods whose node is known, an int, before those named only), then node."""
    node = row["node"]
    return str(type(node)), node if isinstance(node, int) else 0, node if isinstance(node, str) else ""


def object_warnings(kube: Kube, name: str) -> list[str]:
    """Warning events on the object itself (Trainer's TrainJobResourcesCreationFailed sets no condition)."""
    events = [e for e in kube.pod_events(name) if e.get("type") == "Warning"]
    return [f"{name}: {e.get('reason')}: {e.get('message')}" for e in events[-1:]]


def pod_progress(kube: Kube | None, handle: K8sHandle, api: KubeflowApi, run_dir: str) -> Progress | None:
    """How far the job is, from the ``DDPJOB_PROGRESS`` lines in the tail of rank 0's pod log (the
    first pod) of the latest run that has one; the copy ddpjob kept once the pod is gone."""
    import time
    from pathlib import Path

    from launcher.core.progress import progress_from_lines

    for index in reversed(range(len(handle.jobs))):
        name = handle.jobs[index].name
        pods = sorted((name_of(p) for p in kube.list_pods(api.pod_selector(name))), key=sort_key) if kube else []
        kept = sorted(Path(RunFolder(run_dir).pods).glob(f"{name}-*/*{LOG_SUFFIX}"))
        data = kube.pod_log(pods[0], tail=200) if pods and kube is not None else None
        if not data and kept:
            data = kept[-1].read_bytes()[-65536:]
        found = progress_from_lines(data.decode("utf-8", "replace").splitlines(), time.time()) if data else None
        if found:
            return found.of_task(index) if len(handle.jobs) > 1 else found
    return None
