"""Kubernetes target: one Kubeflow ``PyTorchJob`` (kubeflow.org/v1) per run of the job, or with
``k8s.api: trainjob`` one Trainer v2 ``TrainJob`` (``trainjob``); the handle's ``api`` says which.

``inputs`` reads the API's CRD before planning (``crd``: the cluster's own on submit, a local
copy offline); ``plan`` renders plain dicts (the one loop in ``render``, with the API's flavour
from ``flavours``) and checks them (the controller's rules always, the CRD's schema strictly when
there is one); nothing here imports the kubernetes client until a method talks to a cluster
(``client``). ``submit`` has the API server check every
object (``dryRun=All``, ``fieldValidation=Strict``) before creating any. What ``render`` prints is
what ``submit`` sends, apart from ``metadata.namespace``, which is filled from the kubeconfig
context when the spec has none.

The payload and the handle (``payload``: ``K8sHandle``, stored in the registry) hold the
kubeconfig context and namespace used at submit, the shape of the job and the name and parameters
of each run's object.

Run directory: ``plan.txt`` (the manifests sent), ``plan.json``, ``k8s-status.json`` (the last
state seen per PyTorchJob, used once a job has been deleted) and ``pods/`` (every log line read;
see ``logs``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from launcher.core.errors import DdpjobError, TargetError
from launcher.core.jsondata import JSONObject, obj, text
from launcher.targets.base import LogFilter, Plan, PlanContext, Target
from launcher.targets.jobstatus import JobStatus
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi, api_of
from launcher.targets.k8s.objects.flavours import flavour_of
from launcher.targets.k8s.objects.render import secret_env_issues
from launcher.targets.k8s.options import K8sOptions
from launcher.targets.k8s.payload import K8sHandle, K8sPayload, K8sRun, render_text
from launcher.targets.k8s.status import job_status
from launcher.targets.k8s.validation.check import located, spec_where
from launcher.targets.k8s.validation.crd import CrdInput, absent
from launcher.targets.shared.files import from_json, to_json
from launcher.targets.shared.runfolder import RunFolder

if TYPE_CHECKING:
    from launcher.core.progress import Progress
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.k8s.cluster.client import Kube
    from launcher.targets.shared.health import JobHealth
    from launcher.targets.shared.stacks import JobStacks

NCCL_DEFAULTS = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}
NCCL_DEFAULTS_RDMA = {**NCCL_DEFAULTS, "NCCL_IB_DISABLE": "0"}  # k8s.rdma: the pods have InfiniBand


class KubernetesTarget(Target[K8sPayload, K8sHandle]):
    """Submits PyTorchJobs with the official kubernetes client (``pip install 'ddpjob[k8s]'``)."""

    name = "k8s"
    metrics_elsewhere = ("Kubernetes runs write their metrics inside their pods (/workspace/outputs/<id>/ or the "
                         "spec's output_dir), which this machine cannot read: copy them out (kubectl cp) or write to "
                         "a volume you can reach")

    # ------------------------------------------------------------------ plan
    def inputs(self, loaded: LoadedSpec, *, online: bool) -> CrdInput:
        """The PyTorchJob CRD to check against: the cluster's own when ``online`` (submit,
        --dry-run=server; exit 6 when it has none), else $DDPJOB_PYTORCHJOB_CRD or the cache."""
        from launcher.targets.k8s.validation import crd

        api = api_of(loaded.spec.section(K8sOptions).api)
        if not online:
            return crd.offline(api=api)
        return crd.online(_kube(loaded.spec.section(K8sOptions).context, loaded.spec.section(K8sOptions).namespace, api), api)

    def runs_image(self, spec: JobSpec) -> bool:
        return True

    def owns(self, plan: Plan[object]) -> TypeGuard[Plan[K8sPayload]]:
        return isinstance(plan.payload, K8sPayload)

    def load_handle(self, data: dict[str, object]) -> K8sHandle:
        return from_json(K8sHandle, data)

    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan[K8sPayload]:
        spec = loaded.spec
        flavour = flavour_of(spec.section(K8sOptions).api)
        nccl = NCCL_DEFAULTS_RDMA if spec.section(K8sOptions).rdma else NCCL_DEFAULTS
        crd = ctx.inputs if isinstance(ctx.inputs, CrdInput) else absent("no CRD was given to the plan", flavour.api)
        issues = flavour.spec_issues(spec, ctx.job_id) + secret_env_issues(spec, api_of(spec.section(K8sOptions).api).kind)
        if issues:
            raise loaded.error(issues)
        rendered = flavour.render(spec, ctx.job_id, nccl)
        flavour.check(loaded, rendered.objects, crd)
        notes = [crd.note(), runner.header(spec)]
        if spec.workdir is not None and spec.section(K8sOptions).workdir is None:
            notes.append("workdir: is a path on this machine and is not used in the pods; set k8s.workdir "
                         "(default: the image's WORKDIR)")
        payload = K8sPayload(ctx.job_id, ctx.run_dir, spec.nodes, rendered.procs_per_node, spec.section(K8sOptions).namespace,
                             spec.section(K8sOptions).context, rendered.elements, rendered.objects, crd.summary(),
                             spec_where(loaded, flavour.field_targets), spec.section(K8sOptions).cpu is not None, spec.section(K8sOptions).api, notes,
                             len(rendered.objects), runner.watch_port(spec) if runner.enabled(spec) else 0)
        return Plan("k8s", ctx.job_id, spec.name, ctx.run_dir, payload, render_text, spec.nodes, rendered.procs_per_node,
                    len(rendered.elements), checks=payload.checks)

    # ------------------------------------------------------------------ submit
    def submit(self, plan: Plan[K8sPayload]) -> K8sHandle:
        p: K8sPayload = plan.payload
        kube = _kube(p.context, p.namespace, api_of(p.api))
        run_dir = Path(plan.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        RunFolder(run_dir).write_plan(to_json(p), plan.render())
        bodies = _bodies(p, kube.namespace)
        # The API server checks every object first (its schema strictly, admission webhooks, quotas):
        # a refused element of a sweep leaves nothing created.
        for body in bodies:
            _create(kube, p, body, dry_run=True)
        created: list[str] = []
        try:
            for body in bodies:
                _create(kube, p, body, dry_run=False)
                created.append(_name(body))
        except BaseException:
            # A sweep is all or nothing: take back the elements already created.
            for name in created:
                try:
                    kube.delete_job(name)
                except DdpjobError:
                    pass
            raise
        return K8sHandle(
            job_id=plan.job_id, run_dir=plan.run_dir, context=kube.context, namespace=kube.namespace,
            nodes=p.nodes, procs_per_node=p.procs_per_node,
            elastic=any("elasticPolicy" in obj(m.get("spec")) for m in p.manifests),
            jobs=[K8sRun(e.index, e.name, e.params) for e in p.elements], api=p.api, watch_port=p.watch_port,
        )

    def server_dry_run(self, plan: Plan[K8sPayload]) -> str:
        p: K8sPayload = plan.payload
        kube = _kube(p.context, p.namespace, api_of(p.api))
        names = []
        for body in _bodies(p, kube.namespace):
            _create(kube, p, body, dry_run=True)
            names.append(_name(body))
        return (f"# server dry run (dryRun=All, fieldValidation=Strict) on {kube.host}, namespace {kube.namespace}: "
                f"{len(names)} {kube.api.kind}(s) accepted: {', '.join(names)}")

    # ------------------------------------------------------------------ status
    def status(self, handle: K8sHandle) -> JobStatus:
        kube = _kube(handle.context, handle.namespace, api_of(handle.api))
        return job_status(kube, handle, pods=True)

    def status_many(self, handles: dict[str, K8sHandle]) -> dict[str, JobStatus]:
        kubes: dict[tuple[str | None, str, str], Kube] = {}
        out = {}
        for job_id, handle in handles.items():
            key = (handle.context, handle.namespace, handle.api)
            if key not in kubes:
                kubes[key] = _kube(handle.context, handle.namespace, api_of(handle.api))
            out[job_id] = job_status(kubes[key], handle, pods=False)  # one list call per job
        return out

    def read_watch(self, handle: K8sHandle, index: int = 0) -> JSONObject | None:
        """Run ``index``'s ``watch.json`` as its first pod's runner serves it (raw; see ``heartbeat.Watch``),
        or None (no pod runner, the pod not up, or it is gone). Raises TargetError on a 403."""
        from launcher.targets.k8s.cluster.watch import first_pod, read_watch

        if not handle.watch_port:
            return None
        api = api_of(handle.api)
        kube = _kube(handle.context, handle.namespace, api)
        pod = first_pod(kube, handle.jobs[index].name, api)
        return read_watch(kube, pod, handle.watch_port) if pod else None

    def health(self, handle: K8sHandle) -> JobHealth | None:
        """Every rank's health (``shared.health.JobHealth``) from the newest run's first pod, read through
        the pod proxy; after the pods are gone, the sample last read (kept in the run folder)."""
        from launcher.targets.k8s.cluster.watch import latest
        from launcher.targets.shared.health import parse

        if not handle.watch_port:
            return None
        api = api_of(handle.api)
        try:
            kube = _kube(handle.context, handle.namespace, api)
        except DdpjobError:
            kube = None  # the cluster is out of reach: the kept sample is still worth showing
        found = latest(kube, [j.name for j in handle.jobs], api, handle.watch_port, handle.run_dir)
        return parse(found[1], found[0]) if found else None

    def stacks(self, handle: K8sHandle, flt: LogFilter) -> JobStacks:
        """Every live rank's stack, read by py-spy in its pod by the pod's runner and asked through the API
        server's pod proxy (``cluster.stacks``); the latest run with a running pod, or ``flt.task``."""
        from launcher.targets.k8s.cluster.stacks import ask_stacks

        return ask_stacks(_kube(handle.context, handle.namespace, api_of(handle.api)), handle, flt)

    # ------------------------------------------------------------------ logs
    def logs(self, handle: K8sHandle, flt: LogFilter, follow: bool = False) -> Iterator[str]:
        """Lines of every pod, prefixed ``[master-0 rank0]``; see ``launcher.targets.k8s.cluster.logs`` for the rules."""
        from launcher.targets.k8s.cluster.logs import PodLogs

        elements = [{"index": j.index, "name": j.name} for j in handle.jobs]
        if flt.task is not None and not any(e["index"] == flt.task for e in elements):
            raise TargetError(f"task {flt.task} does not exist (this job has {len(elements)} task(s))")
        try:
            kube = _kube(handle.context, handle.namespace, api_of(handle.api))
        except DdpjobError:
            if follow or not os.path.isdir(RunFolder(handle.run_dir).pods):
                raise
            kube = None  # the cluster is out of reach: what was persisted is still worth showing
        elastic = handle.elastic
        if elastic and flt.rank is not None:
            raise TargetError("--rank is not available for elastic jobs: ranks are assigned at each rendezvous, "
                              "not by replica; use --node")
        reader = PodLogs(kube, handle.run_dir, elements, handle.procs_per_node or 1, flt, elastic, api_of(handle.api))
        if not follow or kube is None:  # following, the cluster was reached (above)
            yield from reader.snapshot()
            return
        live = kube
        yield from reader.follow(lambda: job_status(live, handle, pods=False).state.terminal)

    def metrics_files(self, handle: K8sHandle) -> list[str]:
        return []  # the runs write their metrics inside the pods

    def progress(self, handle: K8sHandle) -> Progress | None:
        from launcher.targets.k8s.cluster.pods import pod_progress

        api = api_of(handle.api)
        return pod_progress(_kube(handle.context, handle.namespace, api), handle, api, handle.run_dir)

    # ------------------------------------------------------------------ cancel
    def cancel(self, handle: K8sHandle) -> None:
        kube = _kube(handle.context, handle.namespace, api_of(handle.api))
        for el in handle.jobs:
            kube.delete_job(el.name)  # foreground propagation; a 404 means already gone


def _kube(context: str | None, namespace: str | None, api: KubeflowApi = PYTORCHJOB) -> Kube:
    from launcher.targets.k8s.cluster.client import Kube

    return Kube(context, namespace, api)


def _create(kube: Kube, payload: K8sPayload, body: JSONObject, *, dry_run: bool) -> None:
    """Create (or with ``dry_run``, have the server check) one object; a 422 names the spec's lines."""
    from launcher.targets.k8s.cluster.client import InvalidObject

    try:
        kube.create_job(body, dry_run=dry_run)
    except InvalidObject as e:
        raise located(e, payload.where, payload.k8s_cpu, dry_run=dry_run, kind=kube.api.kind,
                      field_of=flavour_of(payload.api).spec_field) from e


def _bodies(payload: K8sPayload, namespace: str) -> list[JSONObject]:
    out = []
    for manifest in payload.manifests:
        body: JSONObject = copy.deepcopy(manifest)
        meta: JSONObject = {"name": _name(body), "namespace": namespace}
        meta.update({k: v for k, v in obj(body.get("metadata")).items() if k not in ("name", "namespace")})
        body["metadata"] = meta
        out.append(body)
    return out


def _name(body: JSONObject) -> str:
    """An object's ``metadata.name`` (ddpjob's manifests always have one)."""
    return text(obj(body.get("metadata")).get("name"))
