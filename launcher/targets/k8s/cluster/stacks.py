"""``ddpjob stacks`` on Kubernetes: every running pod of a run answers GET ``/stacks.json`` (its runner,
``job/podstacks.py``: its own ranks read by py-spy in the pod), asked through the API server's pod proxy
(RBAC ``pods/proxy`` get, as ``status`` reads ``watch.json``), all pods at once; the pods that do not
answer are named in the note."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from launcher.core.errors import TargetError, TargetUnavailable, UsageError
from launcher.core.jsondata import JSONObject, arr, at
from launcher.targets.k8s.cluster.pods import name_of, pod_ref, sort_key
from launcher.targets.k8s.job.podstacks import NOT_IN_IMAGE
from launcher.targets.k8s.objects.apis import KubeflowApi, api_of
from launcher.targets.shared.runfolder import STACKS_URL_PATH

if TYPE_CHECKING:
    from launcher.targets.base import LogFilter
    from launcher.targets.k8s.cluster.client import Kube
    from launcher.targets.k8s.cluster.pods import PodRef
    from launcher.targets.k8s.payload import K8sHandle
    from launcher.targets.shared.stacks import JobStacks


def ask_stacks(kube: Kube, handle: K8sHandle, flt: LogFilter) -> JobStacks:
    """Every live rank's stack of the run ``flt.task`` names, else of the latest run with a running pod;
    ``flt``'s node and rank choose which. Raises UsageError without a pod runner (``k8s.runner: none``,
    elastic), TargetError when no pod runs, TargetUnavailable when no pod's image has py-spy."""
    import json

    from launcher.targets.shared.stacks import JobStacks
    from launcher.targets.shared.stackshare import rank_stack

    if not handle.watch_port:
        raise UsageError("ddpjob stacks reads the ranks through ddpjob's pod runner, which this job's pods do not "
                         "run (k8s.runner: none, or an elastic job): look at a rank's last lines with ddpjob logs ID --rank R")
    api = api_of(handle.api)
    elements = [{"index": j.index, "name": j.name} for j in handle.jobs]
    if flt.task is not None and not any(e["index"] == flt.task for e in elements):
        raise TargetError(f"task {flt.task} does not exist (this job has {len(elements)} task(s))")
    for el in reversed(handle.jobs) if flt.task is None else [j for j in handle.jobs if j.index == flt.task]:
        pods = _running(kube, el.name, api, elements, len(elements) > 1)
        pods = [p for p in pods if flt.node in (None, p.node)]
        if not pods:
            continue

        def one(pod: PodRef) -> JSONObject | None:
            data = kube.pod_proxy(pod.name, handle.watch_port, STACKS_URL_PATH)
            try:
                said: object = json.loads(data) if data else None
            except ValueError:
                return None
            return said if isinstance(said, dict) and isinstance(said.get("ranks"), list) else None

        with ThreadPoolExecutor(max_workers=min(32, len(pods))) as pool:
            answers = list(pool.map(one, pods))
        said = [a for a in answers if a is not None]
        if said and not any(a.get("py_spy", True) for a in said):
            raise TargetUnavailable(f"ddpjob stacks: {NOT_IN_IMAGE}")
        ranks = [rank_stack(r) for a in said for r in arr(a["ranks"]) if isinstance(r, dict)]
        ranks = [r for r in ranks if flt.node in (None, r.node) and flt.rank in (None, r.rank)]
        silent = [f"{p.name} (node {p.node})" for p, a in zip(pods, answers, strict=True) if a is None]
        note = (f"pod(s) {', '.join(silent)} did not answer on port {handle.watch_port} through the pod proxy (their "
                "runner not up yet or ended, or k8s.runner: none)") if silent else None
        if not ranks and not silent:
            raise TargetError("no live rank to read yet: the pods' torchrun has not started its workers (ddpjob "
                              "status ID says where the run is)")
        return JobStacks(el.index, ranks, note)
    which = f"task {flt.task}" if flt.task is not None else "the job"
    raise TargetError(f"no live rank to read: {which} has no running pod (not started yet, or ended; ddpjob status "
                      "ID says which)")


def _running(kube: Kube, job_name: str, api: KubeflowApi, elements: Sequence[Mapping[str, object]],
             multi: bool) -> list[PodRef]:
    """The run's pods in phase Running, node 0 first."""
    pods = [p for p in kube.list_pods(api.pod_selector(job_name)) if at(p, "status", "phase") == "Running"]
    refs = [pod_ref(name_of(p), elements, multi) for p in pods]
    return sorted((r for r in refs if r is not None), key=lambda r: sort_key(r.name))
