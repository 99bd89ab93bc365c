"""Checks of a rendered TrainJob: Trainer v2.3's webhook and JobSet's rules, and its CRD strictly.

Pure, like ``schema`` (the CRD's schema is an argument). Two layers, as for PyTorchJobs:

- **structural** (always): metadata syntax, a DNS-1035 name, the JobSet pod-name limit (a TrainJob
  whose ``<name>-node-0-<index>-xxxxx`` exceeds 63 characters is accepted, then its JobSet is
  refused forever), the runtime reference the webhook accepts, ``numNodes``/``numProcPerNode`` >= 1,
  no ``PET_*`` in ``trainer.env`` (the torch plugin's), a command that is not ``["tune", "run"]``,
  runtimePatches keyed by a domain-prefixed manager, patching only the replicatedJob and container
  ``node`` and no env in that container;
- **strict** (with the TrainJob CRD): ``schema.strict_issues`` (unknown fields, types, int32 ranges,
  list-map keys). The CRD's CEL rules are about updates (immutability) and are not evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from launcher.core.jsondata import JSON, arr, at
from launcher.core.jsondata import obj as _object
from launcher.targets.k8s.objects.trainjob import (
    POD_NAME_MAX,
    REPLICATED_JOB,
    RUNTIME_GROUP,
    longest_pod_name,
)
from launcher.targets.k8s.validation.schema import DNS1035, SchemaIssue, _metadata_issues, strict_issues

RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
MANAGER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9][-A-Za-z0-9_./]*$")
Path_ = tuple[str | int, ...]


def validate_trainjob(obj: Mapping[str, JSON], schema: Mapping[str, JSON] | None) -> list[SchemaIssue]:
    """Every problem the API server (strict), Trainer's webhook or JobSet would report, in path order
    (then by message: the same order in every process)."""
    issues = structural_issues(obj) + (strict_issues(obj, schema) if schema is not None else [])
    return sorted(set(issues), key=lambda i: ([str(p) for p in i.path], i.message))


def structural_issues(obj: Mapping[str, JSON]) -> list[SchemaIssue]:
    out = _metadata_issues(obj.get("metadata"))
    if obj.get("apiVersion") != "trainer.kubeflow.org/v1alpha1":
        out.append(SchemaIssue(("apiVersion",), "must be trainer.kubeflow.org/v1alpha1"))
    if obj.get("kind") != "TrainJob":
        out.append(SchemaIssue(("kind",), "must be TrainJob"))
    meta = _object(obj.get("metadata"))
    name = meta.get("name", "")
    spec = _object(obj.get("spec"))
    trainer = _object(spec.get("trainer"))
    if not isinstance(name, str) or len(name) > 63 or not DNS1035.match(name):
        out.append(SchemaIssue(("metadata", "name"), f"{name!r} is not a DNS-1035 label of at most 63 characters"))
    nodes = trainer.get("numNodes", 1)
    if isinstance(name, str) and isinstance(nodes, int) and len(longest_pod_name(name, nodes)) > POD_NAME_MAX:
        longest = longest_pod_name(name, nodes)
        out.append(SchemaIssue(("metadata", "name"), f"too long: JobSet would name a pod {longest!r} ({len(longest)} "
                               f"characters, at most {POD_NAME_MAX}) and refuse it"))
    ref = spec.get("runtimeRef")
    if not isinstance(ref, dict) or not ref.get("name"):
        out.append(SchemaIssue(("spec", "runtimeRef"), "needs the name of a training runtime"))
    else:
        if ref.get("apiGroup", RUNTIME_GROUP) != RUNTIME_GROUP:
            out.append(SchemaIssue(("spec", "runtimeRef", "apiGroup"), f"unsupported runtime: the group must be {RUNTIME_GROUP}"))
        if ref.get("kind", RUNTIME_KINDS[0]) not in RUNTIME_KINDS:
            out.append(SchemaIssue(("spec", "runtimeRef", "kind"), f"unsupported runtime: the kind must be one of {', '.join(RUNTIME_KINDS)}"))
    tp: Path_ = ("spec", "trainer")
    for key in ("numNodes", "numProcPerNode"):
        v = trainer.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            out.append(SchemaIssue(tp + (key,), f"must be a whole number >= 1, not {v!r}"))
    if not trainer.get("image"):
        out.append(SchemaIssue(tp + ("image",), "needs an image (the runtime's would run a command it may not have)"))
    command = trainer.get("command")
    if not command:
        out.append(SchemaIssue(tp + ("command",), "needs a command: the torch-distributed runtime has none"))
    elif command == ["tune", "run"]:
        out.append(SchemaIssue(tp + ("command",), "exactly [tune, run] switches Trainer to torchtune's command rewriting"))
    for i, e in enumerate(arr(trainer.get("env"))):
        if isinstance(e, dict) and str(e.get("name", "")).startswith("PET_"):
            out.append(SchemaIssue(tp + ("env", i, "name"), f"{e['name']} is reserved: the torch plugin injects the PET_* variables"))
    out += _patch_issues(spec.get("runtimePatches"))
    return out


def _patch_issues(patches: JSON) -> list[SchemaIssue]:
    out: list[SchemaIssue] = []
    for i, patch in enumerate(arr(patches)):
        if not isinstance(patch, dict):
            continue
        p: Path_ = ("spec", "runtimePatches", i)
        if not MANAGER.match(str(patch.get("manager", ""))):
            out.append(SchemaIssue(p + ("manager",), "must be a domain-prefixed path such as example.com/launcher"))
        jobs = arr(at(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs"))
        for j, rj in enumerate(jobs):
            jp: Path_ = p + ("trainingRuntimeSpec", "template", "spec", "replicatedJobs", j)
            if not isinstance(rj, dict):
                continue
            if rj.get("name") != REPLICATED_JOB:
                out.append(SchemaIssue(jp + ("name",), f"the torch-distributed runtime has only the replicatedJob {REPLICATED_JOB!r}"))
            for k, c in enumerate(arr(at(rj, "template", "spec", "template", "spec", "containers"))):
                cp: Path_ = jp + ("template", "spec", "template", "spec", "containers", k)
                if isinstance(c, dict) and c.get("name") != REPLICATED_JOB:
                    out.append(SchemaIssue(cp + ("name",), f"the runtime's trainer container is {REPLICATED_JOB!r}"))
                if isinstance(c, dict) and c.get("env"):
                    out.append(SchemaIssue(cp + ("env",), "the webhook refuses env in a patch of the trainer container (use trainer.env)"))
    return out

