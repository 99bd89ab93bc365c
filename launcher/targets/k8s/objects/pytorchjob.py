"""The PyTorchJob flavour (``k8s.api: pytorchjob``, ``kubeflow.org/v1``, the default) of the one
render loop in ``render``: its object, what it refuses in a spec, its paths back to the spec, its
status. The rules come from the training operator v1.9.x (see k8s/README.md):

- Always a ``Master`` (1 replica) plus ``Worker`` (nodes - 1, omitted for one node): only with a
  Master does the operator inject MASTER_ADDR/PORT, RANK and the PET_* variables torchrun reads.
- The container is named ``pytorch`` (the operator injects its environment and reads the port
  there) and its rendezvous port is named ``pytorchjob-port``.
- ``nprocPerNode`` gives PET_NPROC_PER_NODE. ddpjob never sets what the operator sets
  (``options.OPERATOR_ENV``: PYTHONUNBUFFERED, MASTER_*, RANK, WORLD_SIZE, PET_*), and refuses it
  in a spec: the operator appends its values after the container's env and the kubelet keeps the
  last one, so a user's value would be silently replaced.
"""

from __future__ import annotations

from launcher.core.errors import Issue
from launcher.core.jsondata import JSON, JSONObject, arr, obj
from launcher.core.states import JobState
from launcher.spec.model import JobSpec
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.objects.apis import PYTORCHJOB
from launcher.targets.k8s.objects.render import (
    FieldMap,
    Run,
    SpecPath,
    container_env,
    duplicate_env_refs,
    field_targets,
    kubelet_escape,
    last_name,
    lookup,
    pod_metadata,
    pod_spec,
    resources,
    volume_mounts,
    volumes,
)
from launcher.targets.k8s.options import K8sOptions, is_operator_env

PORT_NAME = "pytorchjob-port"  # the operator looks the Master's port up by this name
# The operator injects MASTER_ADDR/PORT from the Master's port named pytorchjob-port; every pod has
# its own network namespace, so a fixed port never clashes.
DEFAULT_PORT = 29500
SERVICE_NAME_MAX = 63
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
controller_env = is_operator_env


def spec_issues(spec: JobSpec, job_id: str) -> list[Issue]:
    """Kubernetes-specific problems found from the spec alone, each at the field that causes it."""
    issues: list[Issue] = []
    if not spec.image:
        issues.append(Issue(("image",), "the k8s target needs an image (the pytorch container's image)",
                            hint="add e.g. `image: ghcr.io/ddpjob/train:0.1.0` (see docker/README.md: ddpjob docs docker/README.md)"))
    for name in spec.env:
        if is_operator_env(name):
            issues.append(Issue(("env", name), f"{name} is set by the training operator in every pod, after your env, "
                                "so your value would be silently replaced (k8s/README.md lists these variables: ddpjob docs k8s/README.md)",
                                hint="remove it from env: for the k8s target"))
    issues += duplicate_env_refs(spec, {"DDPJOB_JOB_ID", "DDPJOB_SWEEP_INDEX", "DDPJOB_OUTPUT_DIR", *runner.RUNNER_ENV})
    if "runtime" in spec.section(K8sOptions).model_fields_set:
        issues.append(Issue(("k8s", "runtime"), "a training runtime is used only by k8s.api trainjob (a PyTorchJob has none)",
                            hint="set k8s.api: trainjob, or remove k8s.runtime"))
    issues += runner.spec_issues(spec)
    if spec.stall.action == "fail" and runner.enabled(spec) and spec.section(K8sOptions).restart_policy == "OnFailure" \
            and "restart_policy" in spec.section(K8sOptions).model_fields_set:
        issues.append(Issue(("k8s", "restart_policy"), "with stall.action fail a stalled pod must end the job, and "
                            "OnFailure restarts it in place (up to k8s.backoff_limit times)",
                            hint="set k8s.restart_policy: ExitCode (the default with stall.action fail) or Never, "
                            "or stall.action: report"))
    e = spec.section(K8sOptions).elastic
    if e is not None:
        if spec.nodes < 2:
            issues.append(Issue(("k8s", "elastic"), "an elastic job needs nodes >= 2 (the operator's rendezvous runs on a Worker)"))
        if not e.min_nodes <= spec.nodes <= e.max_nodes:
            issues.append(Issue(("nodes",), f"nodes={spec.nodes} is outside k8s.elastic {e.min_nodes}..{e.max_nodes}"))
    longest = f"{last_name(spec, job_id)}-worker-{max(0, spec.nodes - 2)}"
    if len(longest) > SERVICE_NAME_MAX:
        issues.append(Issue(("name",), f"too long for Kubernetes: the per-pod service {longest!r} has {len(longest)} "
                            f"characters (at most {SERVICE_NAME_MAX})", hint="use a shorter name"))
    return issues


def build(spec: JobSpec, run: Run) -> JSONObject:
    """One run's PyTorchJob."""
    k = spec.section(K8sOptions)
    replica_specs: JSONObject = {"Master": _replica(spec, 1, run)}
    if spec.nodes > 1:
        replica_specs["Worker"] = _replica(spec, spec.nodes - 1, run)
    run_policy: JSONObject = {
        # Running: free GPUs of pods still running when the job ends, keep finished pods and their logs.
        "cleanPodPolicy": "Running",
        "backoffLimit": k.backoff_limit,
    }
    if k.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    job_spec: JSONObject = {"runPolicy": run_policy, "nprocPerNode": str(run.procs_per_node)}
    if k.elastic is not None:
        job_spec["elasticPolicy"] = {
            "minReplicas": k.elastic.min_nodes,
            "maxReplicas": k.elastic.max_nodes,
            "rdzvBackend": k.elastic.rdzv_backend,
            "maxRestarts": spec.max_restarts,
        }
    job_spec["pytorchReplicaSpecs"] = replica_specs
    return {"apiVersion": PYTORCHJOB.api_version, "kind": PYTORCHJOB.kind, "metadata": run.metadata, "spec": job_spec}


def _replica(spec: JobSpec, replicas: int, run: Run) -> JSONObject:
    pod = pod_spec(spec)
    container = _container(spec, run)
    pod["containers"] = [container]
    pod["volumes"] = pod_volumes = volumes(spec)
    if runner.marks(spec):  # restartPolicy OnFailure: where the verdict that ended the run outlives the container
        pod_volumes.append({"name": runner.MARK_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
        arr(container["volumeMounts"]).append({"name": runner.MARK_VOLUME, "mountPath": runner.MARK_DIR})
    # No restartPolicy in the pod template: the operator overwrites it from the replica's (and warns).
    return {
        "replicas": replicas,
        "restartPolicy": runner.restart_policy_of(spec),
        "template": {"metadata": pod_metadata(spec, run.labels), "spec": pod},
    }


def _container(spec: JobSpec, run: Run) -> JSONObject:
    k = spec.section(K8sOptions)
    c: JSONObject = {"name": PYTORCHJOB.container, "image": spec.image or ""}
    if k.image_pull_policy:
        c["imagePullPolicy"] = k.image_pull_policy
    c["command"] = [kubelet_escape(a) for a in run.command]
    if k.workdir:
        c["workingDir"] = k.workdir
    c["env"] = container_env(spec, run.env)
    if k.env_from:
        env_from: list[JSON] = []
        for ef in k.env_from:
            item: JSONObject = {}
            if ef.prefix:
                item["prefix"] = ef.prefix
            ref: JSONObject = {"name": ef.secret or ef.config_map}
            item["secretRef" if ef.secret is not None else "configMapRef"] = ref
            if ef.optional:
                ref["optional"] = True
            env_from.append(item)
        c["envFrom"] = env_from
    c["ports"] = [{"name": PORT_NAME, "containerPort": spec.master_port or DEFAULT_PORT, "protocol": "TCP"}]
    c["resources"] = resources(spec)
    c["volumeMounts"] = volume_mounts(spec)
    return c


# --------------------------------------------------------------------------- object path -> spec field

# Paths below spec.pytorchReplicaSpecs.<Master|Worker> are relative to the replica.
FIELD_MAP: FieldMap = [
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
FIELD_TARGETS = field_targets(FIELD_MAP)


def spec_field(path: SpecPath, spec: JobSpec | None = None, *, k8s_cpu: bool | None = None) -> SpecPath:
    """The spec field behind a path of the rendered PyTorchJob (else the ``k8s`` section).

    ``k8s_cpu``: the CPU request comes from ``k8s.cpu`` (taken from ``spec`` when given)."""
    rel = path[3:] if path[:2] == ("spec", "pytorchReplicaSpecs") and len(path) > 3 else path
    if spec is not None:
        k8s_cpu = spec.section(K8sOptions).cpu is not None
    return lookup(rel, FIELD_MAP, cpu_at=6, k8s_cpu=k8s_cpu)


def one_template(path: SpecPath) -> SpecPath:
    """``path`` without the replica type: a problem of the Master's and the Worker's template is one."""
    return path[:2] + path[3:]


# --------------------------------------------------------------------------- status

def condition_state(status: object) -> tuple[JobState, str]:
    """The state of one PyTorchJob from ``status.conditions``.

    Failed, Succeeded, then Suspended win when True; otherwise the latest True condition among
    Restarting/Running/Created (they are appended in order). No conditions: not reconciled yet.
    """
    conds = [c for c in arr(obj(status).get("conditions")) if isinstance(c, dict)]
    if not conds:
        return JobState.PENDING, NOT_RECONCILED
    true = [c for c in conds if c.get("status") == "True"]
    for ctype in ("Failed", "Succeeded", "Suspended"):
        for c in true:
            if c.get("type") == ctype:
                return PYTORCHJOB_CONDITIONS[ctype], _cond_message(c)
    latest = true[-1] if true else conds[-1]
    return PYTORCHJOB_CONDITIONS.get(str(latest.get("type")), JobState.UNKNOWN), _cond_message(latest)


def _cond_message(c: JSONObject) -> str:
    return str(c.get("message") or c.get("reason") or c.get("type") or "")


def replica_summary(status: object) -> str:
    """``Master: 1 active; Worker: 1 active, 2 succeeded`` from ``status.replicaStatuses``."""
    parts = []
    statuses = obj(obj(status).get("replicaStatuses"))
    for rtype in sorted(statuses):
        counts = obj(statuses[rtype])
        nums = [f"{counts.get(k)} {k}" for k in ("active", "succeeded", "failed") if counts.get(k)]
        parts.append(f"{rtype}: {', '.join(nums) or '0 active'}")
    return "; ".join(parts)
