"""The TrainJob flavour (``k8s.api: trainjob``, Kubeflow Trainer v2's ``trainer.kubeflow.org/v1alpha1``)
of the one render loop in ``render``: its object, what it refuses in a spec, its paths back to the
spec, its status. The rules come from Trainer v2.3.0 (k8s/README.md, "TrainJob"):

- ``spec.runtimeRef`` names the training runtime (ClusterTrainingRuntime ``torch-distributed`` by
  default); ``spec.trainer`` carries the image, the command, ``numNodes``, ``numProcPerNode``
  (an int32), ``resourcesPerNode`` and the env, all applied to the runtime's container ``node``.
- The command is a bare ``torchrun`` without rendezvous flags: the torch plugin injects
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``/``PORT`` into
  ``node`` after our env, and its webhook refuses a TrainJob that sets one. Unlike the training
  operator it sets nothing else, so ``PYTHONUNBUFFERED=1`` is ours to set.
- Everything about the pod goes into one ``spec.runtimePatches`` entry for the replicatedJob
  ``node``: pod labels and annotations (the TrainJob's own are not copied to pods), service
  account, image pull secrets, node selector, tolerations, volumes (``/dev/shm`` included) and the
  container ``node``'s volume mounts (a patch may not set its env).
- What a TrainJob cannot express is refused at the spec's field (``spec_issues``), never dropped.
"""

from __future__ import annotations

from launcher.core.errors import Issue
from launcher.core.jsondata import JSON, JSONObject, arr, obj
from launcher.core.states import JobState
from launcher.spec.model import JobSpec
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.objects.apis import TRAINJOB
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
from launcher.targets.k8s.options import K8sOptions

RUNTIME_GROUP = "trainer.kubeflow.org"
# runtimePatches entries are keyed by a domain-prefixed manager (the webhook insists on the form).
PATCH_MANAGER = "ddpjob.dev/launcher"
REPLICATED_JOB = "node"  # the torch-distributed runtime's one replicatedJob, and its container
# Label and annotation prefixes JobSet, the Job controller and Trainer set on the pods (pods are found by
# jobset.sigs.k8s.io/jobset-name, node ranks read from batch.kubernetes.io/job-completion-index).
JOBSET_PREFIXES = ("jobset.sigs.k8s.io/", "batch.kubernetes.io/", "trainer.kubeflow.org/")
# JobSet names each pod <trainjob>-node-0-<index>-<5 random> and refuses names over 63 characters.
POD_NAME_MAX = 63
PATCH_POD = ("spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", 0,
             "template", "spec", "template")
# TrainJob condition type -> state (v2.3.0 has only these three). Anything else -> UNKNOWN.
TRAINJOB_CONDITIONS: dict[str, JobState] = {
    "Complete": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "Suspended": JobState.PENDING,  # e.g. held by Kueue until admitted
}
NOT_RECONCILED = ("submitted, but not reconciled yet: is Kubeflow Trainer v2 running? "
                  "(kubectl get pods -n kubeflow-system)")


def longest_pod_name(name: str, nodes: int) -> str:
    return f"{name}-node-0-{max(0, nodes - 1)}-xxxxx"


def spec_issues(spec: JobSpec, job_id: str) -> list[Issue]:
    """What a TrainJob cannot carry, or Trainer v2 would refuse, each at the spec field behind it."""
    k = spec.section(K8sOptions)
    issues: list[Issue] = []
    if not spec.image:
        issues.append(Issue(("image",), "the k8s target needs an image (the TrainJob's trainer.image)",
                            hint="add e.g. `image: ghcr.io/ddpjob/train:0.1.0` (see docker/README.md: ddpjob docs docker/README.md)"))
    for name in spec.env:
        if name.startswith("PET_"):
            issues.append(Issue(("env", name), f"{name} is set by Trainer v2's torch plugin (its webhook refuses it)"))
    issues += duplicate_env_refs(spec, {"DDPJOB_JOB_ID", "DDPJOB_SWEEP_INDEX", "DDPJOB_OUTPUT_DIR", "PYTHONUNBUFFERED",
                                        *runner.RUNNER_ENV})
    issues += runner.spec_issues(spec)
    for field in ("labels", "annotations"):
        for key in getattr(k, field):
            if key.startswith(JOBSET_PREFIXES):
                issues.append(Issue(("k8s", field, key), f"{key!r} is set on the pods by JobSet, the Job controller or "
                                    "Trainer v2; yours would be overwritten or break how ddpjob finds the pods"))
    why = "Trainer v2.3 (api trainjob) has no equivalent"
    no_field: list[tuple[tuple[str | int, ...], bool, str]] = [
        (("k8s", "elastic"), k.elastic is not None, f"{why}: TrainJobs are not elastic"),
        (("k8s", "restart_policy"), k.restart_policy != "OnFailure",
         f"{why}: the pods' restart policy comes from the runtime (JobSet's default OnFailure)"),
        (("k8s", "backoff_limit"), "backoff_limit" in k.model_fields_set,
         f"{why}: the backoff limit comes from the runtime's Job template"),
        (("k8s", "ttl_seconds_after_finished"), k.ttl_seconds_after_finished is not None,
         f"{why}: a TrainJob has no TTL (delete it with ddpjob cancel, or set one in the runtime)"),
        (("k8s", "priority_class"), k.priority_class is not None,
         f"{why}: runtimePatches cannot set priorityClassName (set it in the runtime)"),
        (("k8s", "image_pull_policy"), k.image_pull_policy is not None,
         f"{why}: neither trainer nor runtimePatches set imagePullPolicy (set it in the runtime)"),
        (("k8s", "workdir"), k.workdir is not None,
         f"{why}: neither trainer nor runtimePatches set workingDir (use the image's WORKDIR)"),
        (("k8s", "env_from"), bool(k.env_from),
         f"{why}: a TrainJob takes no envFrom (name each variable in k8s.env_refs instead)"),
        (("master_port",), spec.master_port is not None,
         f"{why}: the torch plugin fixes the rendezvous port (PET_MASTER_PORT=29500)"),
    ]
    issues += [Issue(path, message, hint="remove it for k8s.api trainjob") for path, bad, message in no_field if bad]
    longest = longest_pod_name(last_name(spec, job_id), spec.nodes)
    if len(longest) > POD_NAME_MAX:
        issues.append(Issue(("name",), f"too long for Trainer v2: JobSet names the pods like {longest!r} ({len(longest)} "
                            f"characters, at most {POD_NAME_MAX}) and would refuse them", hint="use a shorter name"))
    return issues


def build(spec: JobSpec, run: Run) -> JSONObject:
    """One run's TrainJob."""
    k = spec.section(K8sOptions)
    trainer: JSONObject = {"image": spec.image or "", "command": [kubelet_escape(a) for a in run.command],
                               "env": container_env(spec, run.env), "numNodes": spec.nodes,
                               "numProcPerNode": run.procs_per_node}
    per_node = resources(spec)
    if per_node:
        trainer["resourcesPerNode"] = per_node
    return {
        "apiVersion": TRAINJOB.api_version, "kind": TRAINJOB.kind, "metadata": run.metadata,
        "spec": {
            "runtimeRef": {"apiGroup": RUNTIME_GROUP, "kind": k.runtime.kind, "name": k.runtime.name},
            "trainer": trainer,
            "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": REPLICATED_JOB, "template": {"spec": {"template": _pod(spec, run)}}}],
            }}}}],
        },
    }


def _pod(spec: JobSpec, run: Run) -> JSONObject:
    pod = pod_spec(spec)
    pod["volumes"] = pod_volumes = volumes(spec)
    mounts = volume_mounts(spec)
    if runner.marks(spec):  # where the verdict that ended the run outlives the restarted container
        pod_volumes.append({"name": runner.MARK_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
        mounts.append({"name": runner.MARK_VOLUME, "mountPath": runner.MARK_DIR})
    pod["containers"] = [{"name": REPLICATED_JOB, "volumeMounts": mounts}]
    return {"metadata": pod_metadata(spec, run.labels), "spec": pod}


# --------------------------------------------------------------------------- manifest path -> spec field

# Paths below the runtime patch's pod template (PATCH_POD) are relative to it, as ("pod", ...).
FIELD_MAP: FieldMap = [
    (("metadata", "name"), ("name",)),
    (("metadata", "namespace"), ("k8s", "namespace")),
    (("metadata", "labels"), ("k8s", "labels")),
    (("metadata", "annotations"), ("k8s", "annotations")),
    (("spec", "runtimeRef"), ("k8s", "runtime")),
    (("spec", "trainer", "image"), ("image",)),
    (("spec", "trainer", "command"), ("command",)),
    (("spec", "trainer", "env"), ("env",)),
    (("spec", "trainer", "numNodes"), ("nodes",)),
    (("spec", "trainer", "numProcPerNode"), ("procs_per_node",)),
    (("spec", "trainer", "resourcesPerNode"), ("resources",)),
    (("pod", "metadata"), ("k8s", "labels")),
    (("pod", "spec", "serviceAccountName"), ("k8s", "service_account")),
    (("pod", "spec", "imagePullSecrets"), ("k8s", "image_pull_secrets")),
    (("pod", "spec", "nodeSelector"), ("k8s", "node_selector")),
    (("pod", "spec", "tolerations"), ("k8s", "tolerations")),
    (("pod", "spec", "volumes"), ("k8s", "volumes")),
    (("pod", "spec", "containers"), ("k8s", "volumes")),
]
FIELD_TARGETS = field_targets(FIELD_MAP)


def spec_field(path: SpecPath, spec: JobSpec | None = None, *, k8s_cpu: bool | None = None) -> SpecPath:
    """The spec field behind a path of the rendered TrainJob (else the ``k8s`` section)."""
    rel = ("pod", *path[len(PATCH_POD):]) if tuple(path[: len(PATCH_POD)]) == PATCH_POD else path
    if spec is not None:
        k8s_cpu = spec.section(K8sOptions).cpu is not None
    return lookup(rel, FIELD_MAP, cpu_at=4, k8s_cpu=k8s_cpu)


# --------------------------------------------------------------------------- status

def condition_state(status: object) -> tuple[JobState, str]:
    """The state of one TrainJob from ``status.conditions`` and ``status.jobsStatus``.

    Failed, Complete, then Suspended win when True (v2.3.0 has no Created/Running condition);
    otherwise the child Job's counts: ready -> RUNNING, active -> PENDING (pods starting), none
    -> PENDING (not reconciled yet). Another True condition type -> UNKNOWN.
    """
    conds = [c for c in arr(obj(status).get("conditions")) if isinstance(c, dict)]
    true = [c for c in conds if c.get("status") == "True"]
    for ctype in ("Failed", "Complete", "Suspended"):
        for c in true:
            if c.get("type") == ctype:
                return TRAINJOB_CONDITIONS[ctype], str(c.get("message") or c.get("reason") or ctype)
    other = [c for c in true if c.get("type") not in TRAINJOB_CONDITIONS]
    if other:
        return JobState.UNKNOWN, str(other[-1].get("message") or other[-1].get("type"))
    jobs = [j for j in arr(obj(status).get("jobsStatus")) if isinstance(j, dict)]
    if not jobs:
        return JobState.PENDING, NOT_RECONCILED
    if any(_count(j.get("ready")) for j in jobs):
        return JobState.RUNNING, "running"
    if any(_count(j.get("active")) for j in jobs):
        return JobState.PENDING, "pods are being scheduled or started"
    return JobState.PENDING, "created; waiting for the JobSet's pods"


def _count(value: JSON) -> int:
    """A child Job count as ``int()`` reads it (a number or a numeric string); a list or an object: 0."""
    return int(value) if isinstance(value, (int, float, str)) and value else 0


def jobs_summary(status: object) -> str:
    """``node: 1 ready`` from ``status.jobsStatus`` (counts of child Jobs, not pods); an entry that is not
    an object is left out."""
    parts = []
    for j in arr(obj(status).get("jobsStatus")):
        if not isinstance(j, dict):
            continue
        nums = [f"{j.get(k)} {k}" for k in ("ready", "active", "succeeded", "failed", "suspended") if j.get(k)]
        parts.append(f"{j.get('name', '?')}: {', '.join(nums) or '0 active'} (jobs)")
    return "; ".join(parts)
