"""Render a job spec as ``kubeflow.org/v1`` PyTorchJobs: plain dicts, no kubernetes import.

``ddpjob render --target k8s`` and ``validate`` use only this module (and the schema check), so
they stay fast and work without the ``k8s`` extra. The rules come from the training operator
v1.9.x (see k8s/README.md):

- Always a ``Master`` (1 replica) plus ``Worker`` (nodes - 1, omitted for one node): only with a
  Master does the operator inject MASTER_ADDR/PORT, RANK and the PET_* variables torchrun reads.
- The container is named ``pytorch`` (the operator injects its environment and reads the port
  there) and its rendezvous port is named ``pytorchjob-port``.
- The command is a bare ``torchrun`` without rendezvous flags: PET_NNODES, PET_NODE_RANK,
  PET_MASTER_ADDR/PORT and PET_NPROC_PER_NODE (from ``nprocPerNode``) supply them. ddpjob never
  sets what the operator sets (``OPERATOR_ENV``: PYTHONUNBUFFERED, MASTER_*, RANK, WORLD_SIZE,
  PET_*), and refuses it in a spec: the operator appends its values after the container's env and
  the kubelet keeps the last one, so a user's value would be silently replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from launcher.spec.model import JobSpec, expand
from launcher.targets.k8s.options import is_operator_env
from launcher.targets.shared import dist
from launcher.targets.shared.launch import run_env, torchrun_argv, worker_command

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"  # the operator looks the Master's port up by this name
OUTPUT_ROOT = "/workspace/outputs"
LABEL_JOB_ID = "ddpjob/job-id"
LABEL_SWEEP_ID = "ddpjob/sweep-id"
LABEL_SWEEP_INDEX = "ddpjob/sweep-index"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_OPERATOR_JOB = "training.kubeflow.org/job-name"
ISTIO_ANNOTATION = "sidecar.istio.io/inject"
SERVICE_NAME_MAX = 63
# The operator injects MASTER_ADDR/PORT from the Master's port named pytorchjob-port; every pod has
# its own network namespace, so a fixed port never clashes.
DEFAULT_PORT = 29500


@dataclass
class K8sElement:
    """One run (sweep element) and the name of its PyTorchJob."""

    index: int
    name: str
    params: dict[str, str]
    output_dir: str


@dataclass
class Rendered:
    """The PyTorchJobs of one job (one per sweep element)."""

    objects: list[dict[str, Any]]
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
    """The PyTorchJob's name: the job id, or ``<job id>-<index>`` for an element of a sweep."""
    return f"{job_id}-{index}" if sweep else job_id


def cpu_request(spec: JobSpec) -> str | None:
    value = spec.k8s.cpu if spec.k8s.cpu is not None else spec.resources.cpus
    return None if value is None else str(value)


def render(spec: JobSpec, job_id: str, nccl_defaults: dict[str, str]) -> Rendered:
    """The PyTorchJob of every run of ``spec`` (deterministic: sorted env, fixed key order)."""
    k = spec.k8s
    procs = dist.resolve_procs_per_node(spec, spec.resources.gpus)
    cpus_whole = k.cpu if isinstance(k.cpu, int) else (spec.resources.cpus if k.cpu is None else None)
    base_env = dist.process_env(spec, nccl_defaults, cpus_per_node=cpus_whole, procs_per_node=procs)
    # The operator sets these in every container, after ours (PYTHONUNBUFFERED=1 always): not twice.
    base_env = {k: v for k, v in base_env.items() if not is_operator_env(k)}
    output_root = spec.output_dir or f"{OUTPUT_ROOT}/{job_id}"
    sweep = bool(spec.sweep)
    objects: list[dict[str, Any]] = []
    elements: list[K8sElement] = []
    for el in expand(spec, job_id=job_id, output_root=output_root):
        name = job_name(job_id, el.index, sweep)
        env = run_env(base_env, el.env, job_id=job_id, sweep_index=el.index, output_dir=el.output_dir)
        labels = {LABEL_JOB_ID: job_id}
        if sweep:
            labels[LABEL_SWEEP_ID] = job_id
            labels[LABEL_SWEEP_INDEX] = str(el.index)
        # No rendezvous flags: the operator's PET_* variables give torchrun nodes, rank and master.
        command = torchrun_argv(worker_command(el.command, "python"), launcher=["torchrun"],
                                max_restarts=spec.max_restarts)
        objects.append(_job(spec, name, labels, command, env, procs))
        elements.append(K8sElement(el.index, name, el.params, el.output_dir))
    return Rendered(objects, elements, procs)


def _job(spec: JobSpec, name: str, labels: dict[str, str], command: list[str], env: dict[str, str],
         procs: int) -> dict[str, Any]:
    k = spec.k8s
    job_labels = {**k.labels, **labels}
    if k.queue:
        job_labels[LABEL_QUEUE] = k.queue
    metadata: dict[str, Any] = {"name": name}
    if k.namespace:
        metadata["namespace"] = k.namespace
    metadata["labels"] = dict(sorted(job_labels.items()))
    if k.annotations:
        metadata["annotations"] = dict(sorted(k.annotations.items()))
    replica_specs: dict[str, Any] = {"Master": _replica(spec, 1, labels, command, env)}
    if spec.nodes > 1:
        replica_specs["Worker"] = _replica(spec, spec.nodes - 1, labels, command, env)
    run_policy: dict[str, Any] = {
        # Running: free GPUs of pods still running when the job ends, keep finished pods and their logs.
        "cleanPodPolicy": "Running",
        "backoffLimit": k.backoff_limit,
    }
    if k.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    job_spec: dict[str, Any] = {"runPolicy": run_policy, "nprocPerNode": str(procs)}
    if k.elastic is not None:
        job_spec["elasticPolicy"] = {
            "minReplicas": k.elastic.min_nodes,
            "maxReplicas": k.elastic.max_nodes,
            "rdzvBackend": k.elastic.rdzv_backend,
            "maxRestarts": spec.max_restarts,
        }
    job_spec["pytorchReplicaSpecs"] = replica_specs
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": job_spec}


def _replica(spec: JobSpec, replicas: int, labels: dict[str, str], command: list[str], env: dict[str, str]) -> dict[str, Any]:
    k = spec.k8s
    annotations = {**k.annotations}
    if not k.istio_inject:
        # An Istio sidecar keeps the pod Running after training exits and intercepts the rendezvous.
        annotations[ISTIO_ANNOTATION] = "false"
    pod_meta: dict[str, Any] = {"labels": dict(sorted({**k.labels, **labels}.items()))}
    if annotations:
        pod_meta["annotations"] = dict(sorted(annotations.items()))
    pod_spec: dict[str, Any] = {}
    if k.service_account:
        pod_spec["serviceAccountName"] = k.service_account
    if k.priority_class:
        pod_spec["priorityClassName"] = k.priority_class
    if k.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(k.node_selector.items()))
    if k.tolerations:
        pod_spec["tolerations"] = [_toleration(t) for t in k.tolerations]
    if k.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in k.image_pull_secrets]
    pod_spec["containers"] = [_container(spec, command, env)]
    pod_spec["volumes"] = [
        # Containers get 64 MB of /dev/shm; DataLoader workers and NCCL need more (Bus error otherwise).
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm}},
        *(_volume(v) for v in k.volumes),
    ]
    # No restartPolicy in the pod template: the operator overwrites it from the replica's (and warns).
    return {
        "replicas": replicas,
        "restartPolicy": k.restart_policy,
        "template": {"metadata": pod_meta, "spec": pod_spec},
    }


def _container(spec: JobSpec, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    k = spec.k8s
    c: dict[str, Any] = {"name": CONTAINER, "image": spec.image or ""}
    if k.image_pull_policy:
        c["imagePullPolicy"] = k.image_pull_policy
    c["command"] = [kubelet_escape(a) for a in command]
    if k.workdir:
        c["workingDir"] = k.workdir
    entries: list[dict[str, Any]] = [{"name": n, "value": kubelet_escape(v)} for n, v in env.items()]
    for n, ref in k.env_refs.items():
        source: dict[str, dict[str, Any]]
        if ref.secret is not None:
            source = {"secretKeyRef": {"name": ref.secret, "key": ref.key}}
        else:
            source = {"configMapKeyRef": {"name": ref.config_map, "key": ref.key}}
        if ref.optional:
            next(iter(source.values()))["optional"] = True
        entries.append({"name": n, "valueFrom": source})
    c["env"] = sorted(entries, key=lambda e: e["name"])
    if k.env_from:
        env_from = []
        for ef in k.env_from:
            item: dict[str, Any] = {}
            if ef.prefix:
                item["prefix"] = ef.prefix
            ref_key = "secretRef" if ef.secret is not None else "configMapRef"
            item[ref_key] = {"name": ef.secret or ef.config_map}
            if ef.optional:
                item[ref_key]["optional"] = True
            env_from.append(item)
        c["envFrom"] = env_from
    c["ports"] = [{"name": PORT_NAME, "containerPort": spec.master_port or DEFAULT_PORT, "protocol": "TCP"}]
    c["resources"] = _resources(spec)
    c["volumeMounts"] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        *(_mount(v) for v in k.volumes),
    ]
    return c


def _resources(spec: JobSpec) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    cpu = cpu_request(spec)
    if cpu is not None:
        # A request only: CPU limits throttle data loading and collective progress threads.
        requests["cpu"] = cpu
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = spec.resources.memory
    if spec.resources.gpus:
        # Extended resources must have limits (requests, if given, equal to them).
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.resources.gpus)
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _toleration(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
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


def _volume(v: Any) -> dict[str, Any]:
    if v.pvc is not None:
        src = {"persistentVolumeClaim": {"claimName": v.pvc, **({"readOnly": True} if v.read_only else {})}}
    elif v.config_map is not None:
        src = {"configMap": {"name": v.config_map}}
    elif v.secret is not None:
        src = {"secret": {"secretName": v.secret}}
    else:
        src = {"hostPath": {"path": v.host_path, "type": "Directory"}}
    return {"name": v.name, **src}


def _mount(v: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": v.name, "mountPath": v.mount_path}
    if v.read_only:
        m["readOnly"] = True
    if v.sub_path:
        m["subPath"] = v.sub_path
    return m


# --------------------------------------------------------------------------- checks

# The rendered object's paths, mapped back to the spec field that produced them (longest prefix wins).
_FIELD_MAP: list[tuple[tuple[str | int, ...], tuple[str | int, ...]]] = [
    (("metadata", "name"), ("name",)),
    (("metadata", "namespace"), ("k8s", "namespace")),
    (("metadata", "labels"), ("k8s", "labels")),
    (("metadata", "annotations"), ("k8s", "annotations")),
    (("spec", "nprocPerNode"), ("procs_per_node",)),
    (("spec", "elasticPolicy"), ("k8s", "elastic")),
    (("spec", "runPolicy", "backoffLimit"), ("k8s", "backoff_limit")),
    (("spec", "runPolicy", "ttlSecondsAfterFinished"), ("k8s", "ttl_seconds_after_finished")),
    (("replicas",), ("nodes",)),
    (("restartPolicy",), ("k8s", "restart_policy")),
    (("template", "metadata"), ("k8s", "labels")),
    (("template", "spec", "nodeSelector"), ("k8s", "node_selector")),
    (("template", "spec", "tolerations"), ("k8s", "tolerations")),
    (("template", "spec", "imagePullSecrets"), ("k8s", "image_pull_secrets")),
    (("template", "spec", "serviceAccountName"), ("k8s", "service_account")),
    (("template", "spec", "priorityClassName"), ("k8s", "priority_class")),
    (("template", "spec", "volumes"), ("k8s", "volumes")),
    (("template", "spec", "containers", 0, "image"), ("image",)),
    (("template", "spec", "containers", 0, "imagePullPolicy"), ("k8s", "image_pull_policy")),
    (("template", "spec", "containers", 0, "command"), ("command",)),
    (("template", "spec", "containers", 0, "workingDir"), ("k8s", "workdir")),
    (("template", "spec", "containers", 0, "env"), ("env",)),
    (("template", "spec", "containers", 0, "envFrom"), ("k8s", "env_from")),
    (("template", "spec", "containers", 0, "ports"), ("master_port",)),
    (("template", "spec", "containers", 0, "resources"), ("resources",)),
    (("template", "spec", "containers", 0, "volumeMounts"), ("k8s", "volumes")),
]


# Every spec field a manifest path can map to (``check.spec_where`` locates each at plan time).
FIELD_TARGETS: list[tuple[str | int, ...]] = sorted({t for _, t in _FIELD_MAP} | {("k8s",), ("k8s", "cpu")}, key=str)


def spec_field(path: tuple[str | int, ...], spec: JobSpec | None = None, *,
               k8s_cpu: bool | None = None) -> tuple[str | int, ...]:
    """The spec field behind a path of the rendered PyTorchJob (else the ``k8s`` section).

    ``k8s_cpu``: the CPU request comes from ``k8s.cpu`` (taken from ``spec`` when given)."""
    rel = path
    if path[:2] == ("spec", "pytorchReplicaSpecs") and len(path) > 3:
        rel = path[3:]
    best: tuple[str | int, ...] = ("k8s",)
    best_len = 0
    for prefix, target in _FIELD_MAP:
        if tuple(rel[: len(prefix)]) == prefix and len(prefix) > best_len:
            best, best_len = target, len(prefix)
    if spec is not None:
        k8s_cpu = spec.k8s.cpu is not None
    if best == ("resources",) and k8s_cpu and len(rel) > 6 and rel[6] == "cpu":
        best = ("k8s", "cpu")
    return best


# --------------------------------------------------------------------------- text

if TYPE_CHECKING:
    _SafeDumper = yaml.SafeDumper
else:
    _SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: 10x faster, and exact


class _NoAliasDumper(_SafeDumper):
    """Never emit anchors/aliases: shared dicts are written out in full, as kubectl shows them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_NoAliasDumper.add_representer(str, _str_presenter)


def to_yaml(obj: dict[str, Any]) -> str:
    """One manifest as YAML (key order as built, which is fixed; no aliases; wide lines)."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=4096,
                     allow_unicode=True)


def render_text(rendered: Rendered, job_id: str, namespace: str | None, notes: list[str]) -> str:
    """The multi-document YAML that ``submit`` sends, with a comment header for the reader."""
    head = [f"# ddpjob k8s plan: job {job_id}, {len(rendered.objects)} PyTorchJob(s) ({API_VERSION})"]
    if namespace is None:
        head.append("# namespace: the kubeconfig context's (set k8s.namespace to choose)")
    head.extend(f"# {n}" for n in notes)
    docs = [to_yaml(o) for o in rendered.objects]
    return "\n".join(head) + "\n---\n" + "---\n".join(docs)

