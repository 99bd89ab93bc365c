"""The one render loop of the k8s target: a job spec as one Kubeflow object per run, plain dicts, no
kubernetes import (``render``, ``validate`` and ``--dry-run`` stay fast and work without the
``k8s`` extra).

The loop and every part the two APIs share are here; what differs is a small flavour each
(``pytorchjob``: PyTorchJob of the training operator v1.9; ``trainjob``: TrainJob of Trainer v2.3;
paired with their checks in ``flavours``): it builds its object from a ``Run`` and maps the
object's paths back to the spec (``lookup``). Shared rules (k8s/README.md):

- The command is ``torchrun`` without rendezvous flags: the controller injects PET_NNODES,
  PET_NODE_RANK, PET_MASTER_ADDR/PORT and PET_NPROC_PER_NODE after our env (a flavour names the
  variables its controller sets, and the loop leaves them out). ddpjob's pod runner starts it
  (``runner``: ``python3 -c ...`` with the runner's code in the env) unless ``k8s.runner: none``.
- ``$`` in the command and env is escaped for the kubelet; env sorted; key order fixed.
- ddpjob's labels (job id, sweep) on the object and its pods; Kueue's queue label on the object.
- ``/dev/shm`` as a memory-backed emptyDir beside the spec's volumes; no Istio sidecar unless asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core.errors import Issue
from launcher.core.jsondata import JSONList, JSONObject
from launcher.spec.model import JobSpec
from launcher.spec.sweep import expand
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.options import K8sOptions, Toleration, Volume
from launcher.targets.k8s.payload import K8sElement
from launcher.targets.shared import dist
from launcher.targets.shared.launch import run_env, torchrun_argv, worker_command

OUTPUT_ROOT = "/workspace/outputs"
LABEL_JOB_ID = "ddpjob/job-id"
LABEL_SWEEP_ID = "ddpjob/sweep-id"
LABEL_SWEEP_INDEX = "ddpjob/sweep-index"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
ISTIO_ANNOTATION = "sidecar.istio.io/inject"

SpecPath = tuple[str | int, ...]
# A flavour's map of its object's paths (relative, see ``lookup``) to the spec fields that produce them.
FieldMap = list[tuple[SpecPath, SpecPath]]


@dataclass
class Run:
    """One run as the loop hands it to a flavour's builder."""

    name: str
    metadata: JSONObject  # the object's own: name, namespace, labels, annotations
    labels: dict[str, str]  # ddpjob's labels, for the pods as well
    command: list[str]  # before kubelet escaping
    env: dict[str, str]  # before kubelet escaping, sorted
    procs_per_node: int


Builder = Callable[[JobSpec, Run], JSONObject]


@dataclass
class Rendered:
    """The objects of one job (one per sweep element)."""

    objects: list[JSONObject]
    elements: list[K8sElement]
    procs_per_node: int


def kubelet_escape(text: str) -> str:
    """Make ``text`` reach the process literally although the kubelet expands ``$(VAR)``.

    The kubelet expands ``$(NAME)`` in command, args and env values and turns ``$$`` into ``$``;
    any other ``$`` is kept. Doubling every ``$`` is therefore exact: ``$(X)`` -> ``$$(X)`` ->
    ``$(X)``, ``$$`` -> ``$$$$`` -> ``$$``, ``a$b`` -> ``a$$b`` -> ``a$b``.
    """
    return text.replace("$", "$$")


def job_name(job_id: str, index: int, sweep: bool) -> str:
    """The object's name: the job id, or ``<job id>-<index>`` for an element of a sweep."""
    return f"{job_id}-{index}" if sweep else job_id


def last_name(spec: JobSpec, job_id: str) -> str:
    """The name of the last run's object: the longest of the job (what the controller derives from it has limits)."""
    runs = math.prod(len(values) for values in spec.sweep.values())
    return job_name(job_id, runs - 1, bool(spec.sweep))


def duplicate_env_refs(spec: JobSpec, ours: set[str]) -> list[Issue]:
    """``k8s.env_refs`` names also in ``env:`` or among the variables ddpjob sets (``ours``)."""
    plain = set(spec.env) | ours
    return [Issue(("k8s", "env_refs", name), f"{name} is also set in env: (a duplicate env name is rejected by the API server)",
                  hint="keep one of them") for name in spec.section(K8sOptions).env_refs if name in plain]


def secret_env_issues(spec: JobSpec, kind: str) -> list[Issue]:
    """Secret-named ``env:`` values, refused: the cluster would get them as plain ``value:`` in the
    job's object, readable by anyone who may read the job. A Secret referred to by ``k8s.env_refs``
    keeps the value out of the object (and out of ddpjob's plan and registry)."""
    from launcher.spec.secrets import is_secret, why_secret

    return [Issue(("env", name), f"{name} {why_secret(name, value)}: on Kubernetes its value would be written as plain text into "
                  f"the {kind}, readable by anyone who may read the job",
                  hint=f"keep it in a Secret and refer to it: kubectl create secret generic NAME --from-literal="
                  f"KEY=..., then k8s.env_refs: {{{name}: {{secret: NAME, key: KEY}}}} (and remove it from env:)")
            for name, value in spec.env.items() if is_secret(name, value)]


def cpu_request(spec: JobSpec) -> str | None:
    value = spec.section(K8sOptions).cpu if spec.section(K8sOptions).cpu is not None else spec.resources.cpus
    return None if value is None else str(value)


def _strings(values: dict[str, str]) -> JSONObject:
    """``values`` sorted by key, as a JSON object."""
    return dict(sorted(values.items()))


def render(spec: JobSpec, job_id: str, nccl_defaults: dict[str, str], build: Builder,
           controller_env: Callable[[str], bool] | None = None) -> Rendered:
    """The object ``build`` makes of every run of ``spec`` (deterministic: sorted env, fixed key order).

    ``controller_env``: the variables the controller sets in every container after ours; left out
    of ddpjob's defaults so that none is set twice."""
    k = spec.section(K8sOptions)
    procs = dist.resolve_procs_per_node(spec, spec.resources.gpus)
    cpus_whole = k.cpu if isinstance(k.cpu, int) else (spec.resources.cpus if k.cpu is None else None)
    base_env = dist.process_env(spec, nccl_defaults, cpus_per_node=cpus_whole, procs_per_node=procs)
    if controller_env is not None:
        base_env = {n: v for n, v in base_env.items() if not controller_env(n)}
    output_root = spec.output_dir or f"{OUTPUT_ROOT}/{job_id}"
    sweep = bool(spec.sweep)
    objects: list[JSONObject] = []
    elements: list[K8sElement] = []
    for el in expand(spec, job_id=job_id, output_root=output_root):
        name = job_name(job_id, el.index, sweep)
        env = run_env(base_env, el.env, job_id=job_id, sweep_index=el.index, output_dir=el.output_dir)
        env["DDPJOB_PROGRESS_LINES"] = "1"  # the metrics file stays in the pod: progress comes from the log
        labels = {LABEL_JOB_ID: job_id}
        if sweep:
            labels[LABEL_SWEEP_ID] = job_id
            labels[LABEL_SWEEP_INDEX] = str(el.index)
        # No rendezvous flags: the controller's PET_* variables give torchrun nodes, rank and master.
        command = torchrun_argv(worker_command(el.command, "python"), launcher=["torchrun"],
                                max_restarts=spec.max_restarts)
        if runner.enabled(spec):  # the stall watch in every pod (``runner``, ``podrun``)
            command = runner.wrap(spec, command)
            env = dict(sorted({**env, **runner.env(spec)}.items()))
        objects.append(build(spec, Run(name, _metadata(spec, name, labels), labels, command, env, procs)))
        elements.append(K8sElement(el.index, name, el.params, el.output_dir))
    return Rendered(objects, elements, procs)


def _metadata(spec: JobSpec, name: str, labels: dict[str, str]) -> JSONObject:
    k = spec.section(K8sOptions)
    job_labels = {**k.labels, **labels}
    if k.queue:
        job_labels[LABEL_QUEUE] = k.queue  # Kueue reads the queue from the object's own label
    metadata: JSONObject = {"name": name}
    if k.namespace:
        metadata["namespace"] = k.namespace
    metadata["labels"] = _strings(job_labels)
    if k.annotations:
        metadata["annotations"] = _strings(k.annotations)
    return metadata


# --------------------------------------------------------------------------- parts of the pods

def pod_metadata(spec: JobSpec, labels: dict[str, str]) -> JSONObject:
    """The pods' labels and annotations (neither API copies the object's own to its pods)."""
    k = spec.section(K8sOptions)
    annotations = {**k.annotations}
    if not k.istio_inject:
        # An Istio sidecar keeps the pod Running after training exits and intercepts the rendezvous.
        annotations[ISTIO_ANNOTATION] = "false"
    meta: JSONObject = {"labels": _strings({**k.labels, **labels})}
    if annotations:
        meta["annotations"] = _strings(annotations)
    return meta


def pod_spec(spec: JobSpec) -> JSONObject:
    """The pod spec's scheduling fields; each flavour adds the containers and volumes."""
    k = spec.section(K8sOptions)
    pod: JSONObject = {}
    if k.service_account:
        pod["serviceAccountName"] = k.service_account
    if k.priority_class:
        pod["priorityClassName"] = k.priority_class
    if k.node_selector:
        pod["nodeSelector"] = _strings(k.node_selector)
    if k.tolerations:
        pod["tolerations"] = [_toleration(t) for t in k.tolerations]
    if k.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in k.image_pull_secrets]
    return pod


def volumes(spec: JobSpec) -> JSONList:
    return [
        # Containers get 64 MB of /dev/shm; DataLoader workers and NCCL need more (Bus error otherwise).
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm}},
        *(_volume(v) for v in spec.section(K8sOptions).volumes),
    ]


def volume_mounts(spec: JobSpec) -> JSONList:
    return [{"name": "dshm", "mountPath": "/dev/shm"}, *(_mount(v) for v in spec.section(K8sOptions).volumes)]


def container_env(spec: JobSpec, env: dict[str, str]) -> JSONList:
    """The container's ``env``: ``env`` (escaped) and the spec's ``k8s.env_refs``, sorted by name."""
    entries: list[tuple[str, JSONObject]] = [(n, {"name": n, "value": kubelet_escape(v)}) for n, v in env.items()]
    for n, ref in spec.section(K8sOptions).env_refs.items():
        key_ref: JSONObject = {"name": ref.secret if ref.secret is not None else ref.config_map, "key": ref.key}
        if ref.optional:
            key_ref["optional"] = True
        source: JSONObject = {"secretKeyRef" if ref.secret is not None else "configMapKeyRef": key_ref}
        entries.append((n, {"name": n, "valueFrom": source}))
    return [entry for _, entry in sorted(entries, key=lambda e: e[0])]


def resources(spec: JobSpec) -> JSONObject:
    """One node's requests and limits."""
    requests: JSONObject = {}
    limits: JSONObject = {}
    cpu = cpu_request(spec)
    if cpu is not None:
        # A request only: CPU limits throttle data loading and collective progress threads.
        requests["cpu"] = cpu
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = spec.resources.memory
    if spec.resources.gpus:
        # Extended resources must have limits (requests, if given, equal to them).
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.resources.gpus)
    out: JSONObject = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _toleration(t: Toleration) -> JSONObject:
    out: JSONObject = {}
    if t.key is not None:
        out["key"] = t.key
    out["operator"] = t.operator
    if t.value is not None:
        out["value"] = t.value
    if t.effect is not None:
        out["effect"] = t.effect
    if t.toleration_seconds is not None:
        out["tolerationSeconds"] = t.toleration_seconds
    return out


def _volume(v: Volume) -> JSONObject:
    src: JSONObject
    if v.pvc is not None:
        src = {"persistentVolumeClaim": {"claimName": v.pvc, **({"readOnly": True} if v.read_only else {})}}
    elif v.config_map is not None:
        src = {"configMap": {"name": v.config_map}}
    elif v.secret is not None:
        src = {"secret": {"secretName": v.secret}}
    else:
        src = {"hostPath": {"path": v.host_path, "type": "Directory"}}
    return {"name": v.name, **src}


def _mount(v: Volume) -> JSONObject:
    m: JSONObject = {"name": v.name, "mountPath": v.mount_path}
    if v.read_only:
        m["readOnly"] = True
    if v.sub_path:
        m["subPath"] = v.sub_path
    return m


# --------------------------------------------------------------------------- object path -> spec field

def field_targets(field_map: FieldMap) -> list[SpecPath]:
    """Every spec field a path of ``field_map`` can map to, with ``k8s`` and ``k8s.cpu``
    (``check.spec_where`` locates each at plan time)."""
    return sorted({t for _, t in field_map} | {("k8s",), ("k8s", "cpu")}, key=str)


def lookup(rel: SpecPath, field_map: FieldMap, *, cpu_at: int, k8s_cpu: bool | None) -> SpecPath:
    """The spec field behind ``rel``, a path relative to what the flavour's ``field_map`` describes:
    its longest prefix there, else the ``k8s`` section. The CPU request (``rel[cpu_at]``) is
    ``k8s.cpu`` when that set it (``k8s_cpu``)."""
    best: SpecPath = ("k8s",)
    best_len = 0
    for prefix, target in field_map:
        if tuple(rel[: len(prefix)]) == prefix and len(prefix) > best_len:
            best, best_len = target, len(prefix)
    if best == ("resources",) and k8s_cpu and len(rel) > cpu_at and rel[cpu_at] == "cpu":
        best = ("k8s", "cpu")
    return best
