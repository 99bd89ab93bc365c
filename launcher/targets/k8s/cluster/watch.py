"""The stall watch of a Kubernetes run as ``status`` sees it, without a shared filesystem: the first
pod's runner (``podrun``) serves its ``watch.json`` on ``runner.watch_port``, read here through the
API server's pod proxy (RBAC ``pods/proxy`` get) and told with the one function Slurm's status uses
(``heartbeat.report``); a run a runner ended (``stall.action: fail``, a loss recovery could not
survive) is named from the line it printed (``podrun.STALL_LINE``, ``RECOVERY_LINE``) in the pod's log,
and an ended run's losses from the line its first pod's runner printed last (``TOLD_LINE``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.core.errors import TargetError
from launcher.core.jsondata import JSONObject, at
from launcher.targets.k8s.cluster.pods import container, name_of, pod_ref, sort_key
from launcher.targets.k8s.job.podrun import END_EXIT, RECOVERY_LINE, STALL_LINE, TOLD_LINE
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi
from launcher.targets.shared.runfolder import WATCH_URL_PATH, RunFolder

if TYPE_CHECKING:
    from launcher.targets.k8s.cluster.client import Kube


def first_pod(kube: Kube, job_name: str, api: KubeflowApi, nodes: Sequence[Mapping[str, object]] | None = None) -> str | None:
    """The name of the run's node-0 pod: from ``status``'s rows when given, else its fixed name (a
    PyTorchJob's Master), else a list call (a TrainJob's pods end in random characters)."""
    if nodes is not None:
        return next((str(n["pod"]) for n in nodes if n.get("node") == 0 and n.get("pod")), None)
    if api is PYTORCHJOB:
        return f"{job_name}-master-0"
    names = sorted((name_of(p) for p in kube.list_pods(api.pod_selector(job_name))), key=sort_key)
    refs = [pod_ref(n, [{"index": 0, "name": job_name}], False) for n in names]
    return next((r.name for r in refs if r is not None and r.node == 0), None)


def read_watch(kube: Kube, pod: str, port: int) -> JSONObject | None:
    """The first pod's ``watch.json`` (raw), or None while there is none (runner not up, or k8s.runner: none).

    Raises:
        TargetError: the API server refused (403: no ``pods/proxy`` get in the user's role).
    """
    data = kube.pod_proxy(pod, port, WATCH_URL_PATH)
    if not data:
        return None
    try:
        state: object = json.loads(data)
    except ValueError:
        return None
    return state if isinstance(state, dict) and "nodes" in state else None


def kept(run_dir: str, index: int) -> str:
    """Where the last ``watch.json`` read of run ``index`` is kept, for ``top`` once the pods are gone."""
    return RunFolder(run_dir).kept_watch(index)


def latest(kube: Kube | None, job_names: list[str], api: KubeflowApi, port: int, run_dir: str) -> tuple[int, JSONObject] | None:
    """The newest run's ``watch.json`` read through the pod proxy (and kept in the run folder), else the
    one kept when it was last read; None when there is neither. A 403 raises TargetError."""
    from launcher.targets.shared.files import read_json, write_json

    for index in reversed(range(len(job_names))):
        pod = first_pod(kube, job_names[index], api) if kube is not None else None
        state = read_watch(kube, pod, port) if kube is not None and pod else None
        if state is not None:
            try:
                write_json(kept(run_dir, index), state)
            except OSError:
                pass  # a full or read-only home: the live sample is still shown
            return index, state
        old = read_json(kept(run_dir, index))
        if isinstance(old, dict):
            return index, old
    return None


def note(kube: Kube, pod: str | None, port: int) -> tuple[str | None, JSONObject | None]:
    """What ``status`` adds about a running run: the watch's verdict (``heartbeat.report``), or one line
    saying why the watch cannot be read (None when all is well or there is nothing to read yet); and the
    watch's state as read (None when it was not)."""
    from launcher.targets.shared.heartbeat import report

    if pod is None:
        return None, None
    try:
        state = read_watch(kube, pod, port)
    except TargetError as e:
        first = str(e).splitlines()[0]
        return (f"watch unreadable: {first}" + ("; k8s/rbac.yaml grants it (pods/proxy get; ddpjob docs k8s/rbac.yaml prints it)" if "(403)" in first else ""),
                None)
    return (report(state, time.time()) if state is not None else None), state


def ending(kube: Kube, job_name: str, api: KubeflowApi) -> str | None:
    """Why a pod's runner ended the run, from the log of the pod whose runner exited ``END_EXIT`` (its
    container now, or the one before it, where the runtime restarts it in place): ``stalled: <verdict>``
    (``stall.action: fail``), or the loss recovery could not survive (``node 1 (...) was lost: ...; not
    brought back: ...``); None when none did."""
    for pod in sorted(kube.list_pods(api.pod_selector(job_name)), key=lambda p: sort_key(name_of(p))):
        status = container(pod, api.container) or {}
        now = at(status, "state", "terminated", "exitCode") == END_EXIT
        if not now and at(status, "lastState", "terminated", "exitCode") != END_EXIT:
            continue
        data = kube.pod_log(name_of(pod), tail=50, previous=not now) or b""
        for line in reversed(data.decode("utf-8", "replace").splitlines()):
            if STALL_LINE in line:
                return "stalled: " + line.split(STALL_LINE, 1)[1].strip()
            if RECOVERY_LINE in line:
                return line.split(RECOVERY_LINE, 1)[1].strip()
    return None


def last_told(kube: Kube, job_name: str, api: KubeflowApi) -> JSONObject | None:
    """What the first pod's runner said of the run's losses as it ended (``podrun.TOLD_LINE``: the recovery's
    record and the metrics events that tell it, as ``watch.json`` carried them), from the end of its log;
    None where it said nothing (no loss, no recovery, or the pod is gone)."""
    try:
        pod = first_pod(kube, job_name, api)
        data = kube.pod_log(pod, tail=50) if pod else None
    except TargetError:  # no pods/log get in the user's role, or the API server away: the status stands
        return None
    for line in reversed((data or b"").decode("utf-8", "replace").splitlines()):
        if TOLD_LINE in line:
            try:
                said: object = json.loads(line.split(TOLD_LINE, 1)[1])
            except ValueError:
                return None
            return said if isinstance(said, dict) and isinstance(said.get("recovery"), dict) else None
    return None
