"""The pods of a PyTorchJob as ``logs`` sees them: which replica (task, node) a pod is, which file
keeps each run of its container under ``pods/``, and a lock so one reader owns a pod's files."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi
from launcher.targets.shared.runfolder import LOG_SUFFIX, RunFolder

if TYPE_CHECKING:
    from launcher.core.progress import Progress

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


def pod_ref(pod_name: str, elements: list[dict[str, Any]], multi: bool) -> PodRef | None:
    """Task and node of a pod from its name: ``<job>-master-0`` is node 0, ``<job>-worker-i`` node i+1;
    a TrainJob's ``<job>-node-0-<i>-xxxxx`` is node i (its completion index, which is PET_NODE_RANK)."""
    m = _POD_RE.match(pod_name)
    if not m:
        n = _NODE_RE.match(pod_name)
        task = next((e["index"] for e in elements if n and e["name"] == n.group("job")), None)
        if n is None or task is None:
            return None
        return PodRef(pod_name, task, int(n.group("index")), (f"task{task} " if multi else "") + f"node-{n.group('index')}")
    task = next((e["index"] for e in elements if e["name"] == m.group("job")), None)
    if task is None:
        return None
    index = int(m.group("index"))
    node = 0 if m.group("type") == "master" else index + 1
    label = (f"task{task} " if multi else "") + f"{m.group('type')}-{index}"
    return PodRef(pod_name, task, node, label)


def attempt_file(pods_dir: Path, pod: dict[str, Any], restarts: int) -> Path:
    meta: dict[str, Any] = pod["metadata"]
    name: str = meta["name"]
    created = re.sub(r"[^0-9TZ]", "", meta.get("creationTimestamp") or "0")
    return pods_dir / name / f"{created}-{(meta.get('uid') or 'nouid')[:8]}-r{restarts:03d}.log"


def path_uid(path: Path, pod: dict[str, Any]) -> str | None:
    """The pod uid behind an attempt file, if it is this pod's (the name holds its first 8 characters)."""
    uid = pod["metadata"].get("uid") or ""
    return uid if f"-{uid[:8]}-r" in path.name else None


def container(pod: dict[str, Any], name: str = PYTORCHJOB.container) -> dict[str, Any] | None:
    statuses: list[dict[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == name:
            return cs
    return None


def started(cs: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """The container has run (or runs): a status that is not None and not still waiting for its first start."""
    if cs is None:
        return False
    state = cs.get("state") or {}
    return "running" in state or "terminated" in state or int(cs.get("restartCount") or 0) > 0


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


def read_chunks(resp: Any) -> Iterator[bytes]:
    while True:
        data = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not data:
            return
        yield data


def close(resp: Any) -> None:
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


def pod_nodes(kube: Any, job_name: str, api: KubeflowApi = PYTORCHJOB) -> tuple[list[dict[str, Any]], list[str]]:
    """Per-pod rows for ``status`` and the scheduling events of Pending pods."""
    nodes: list[dict[str, Any]] = []
    pending: list[str] = []
    for pod in kube.list_pods(api.pod_selector(job_name)):
        name = pod["metadata"]["name"]
        ref = pod_ref(name, [{"index": 0, "name": job_name}], False)
        st = pod.get("status") or {}
        cs: dict[str, Any] = next((c for c in st.get("containerStatuses") or [] if c.get("name") == api.container), {})
        row: dict[str, Any] = {"node": ref.node if ref else name, "pod": name, "phase": st.get("phase", "?"),
                               "restarts": cs.get("restartCount", 0)}
        state = cs.get("state") or {}
        if state.get("terminated"):
            row["exit_code"] = state["terminated"].get("exitCode")
        if (state.get("waiting") or {}).get("reason") and st.get("phase") == "Running":
            row["waiting"] = state["waiting"]["reason"]  # restarting: CrashLoopBackOff
        last = ((cs.get("lastState") or {}).get("terminated") or {}).get("exitCode")
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
    nodes.sort(key=lambda n: (str(type(n["node"])), n["node"]))
    return nodes, pending


def object_warnings(kube: Any, name: str) -> list[str]:
    """Warning events on the object itself (Trainer's TrainJobResourcesCreationFailed sets no condition)."""
    events = [e for e in kube.pod_events(name) if e.get("type") == "Warning"]
    return [f"{name}: {e.get('reason')}: {e.get('message')}" for e in events[-1:]]


def pod_progress(kube: Any, handle: Any, api: Any, run_dir: str) -> Progress | None:
    """How far the job is, from the ``DDPJOB_PROGRESS`` lines in the tail of rank 0's pod log (the
    first pod) of the latest run that has one; the copy ddpjob kept once the pod is gone."""
    import time
    from pathlib import Path

    from launcher.core.progress import progress_from_lines

    for index in reversed(range(len(handle.jobs))):
        name = handle.jobs[index].name
        pods = sorted((p["metadata"]["name"] for p in kube.list_pods(api.pod_selector(name))), key=sort_key) if kube else []
        kept = sorted(Path(RunFolder(run_dir).pods).glob(f"{name}-*/*{LOG_SUFFIX}"))
        data = kube.pod_log(pods[0], tail=200) if pods else None
        if not data and kept:
            data = kept[-1].read_bytes()[-65536:]
        found = progress_from_lines(data.decode("utf-8", "replace").splitlines(), time.time()) if data else None
        if found:
            return found.of_task(index) if len(handle.jobs) > 1 else found
    return None
