"""Strict validation of a PyTorchJob against the upstream CRD schema, plus the operator's own rules.

Plain JSON Schema validation of the CRD misses what the API server and the training operator
enforce (see k8s/README.md); this module adds:

1. unknown fields rejected (the server prunes them silently, or rejects them with
   ``fieldValidation=Strict``): ``additionalProperties: false`` on every object with properties;
2. ``int32``/``int64`` ranges;
3. ``x-kubernetes-list-type: map`` key uniqueness (duplicate env names, container ports ...),
   after applying the schema's defaults to key fields (a port's ``protocol`` defaults to TCP);
4. the webhook's rules: DNS-1035 names short enough for ``<job>-worker-<N>`` services, replica
   keys ``Master``/``Worker``, a ``pytorch`` container with an image, ``Master.replicas == 1``,
   enum-like fields the schema leaves as free strings, and ``elasticPolicy.standalone`` refused
   (``PET_STANDALONE=""`` makes torchrun fail parsing its arguments).

The CRD is not part of ddpjob: it is read from ``$DDPJOB_PYTORCHJOB_CRD``; without it the strict
check does not run and the plan says so.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import TargetUnavailable, dotted_path

CRD_ENV = "DDPJOB_PYTORCHJOB_CRD"
CRD_NAME = "kubeflow.org_pytorchjobs.yaml"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
METADATA_FIELDS = {"name", "namespace", "labels", "annotations", "generateName", "ownerReferences", "finalizers",
                   "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                   "deletionGracePeriodSeconds", "managedFields", "selfLink"}
ENUMS = {
    ("restartPolicy",): {"Always", "OnFailure", "Never", "ExitCode"},
    ("cleanPodPolicy",): {"None", "Running", "All"},
    ("rdzvBackend",): {"c10d", "etcd", "etcd-v2"},
}
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class SchemaIssue:
    """One problem: ``path`` into the PyTorchJob object and what is wrong there."""

    path: Path_
    message: str

    def __str__(self) -> str:
        return f"{dotted_path(self.path)}: {self.message}"


def default_crd_path() -> Path | None:
    """The PyTorchJob CRD to check against: ``$DDPJOB_PYTORCHJOB_CRD``, else None (not checked)."""
    env = os.environ.get(CRD_ENV)
    return Path(env) if env else None


@functools.lru_cache(maxsize=4)
def _load_crd(path: str) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with open(path, encoding="utf-8") as f:
            crd = yaml.load(f, Loader=loader)  # noqa: S506 - a safe loader
    except FileNotFoundError as e:
        raise TargetUnavailable(
            f"the PyTorchJob CRD schema was not found at {path}; set {CRD_ENV} to a copy of {CRD_NAME} "
            "(kubeflow/trainer v1.9.x, manifests/base/crds/) to validate Kubernetes jobs"
        ) from e
    versions = [v for v in crd["spec"]["versions"] if v.get("name") == "v1"]
    if not versions:
        raise TargetUnavailable(f"{path} has no v1 version of the PyTorchJob CRD")
    return _strict(versions[0]["schema"]["openAPIV3Schema"])


def _strict(node: Any) -> Any:
    """A copy of the schema where every object with properties refuses unknown fields."""
    node = copy.deepcopy(node)

    def walk(n: Any) -> None:
        if isinstance(n, dict):
            if n.get("type") == "object" and "properties" in n and "additionalProperties" not in n:
                n["additionalProperties"] = False
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    walk(node)
    return node


def schema(crd_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    path = crd_path or default_crd_path()
    if path is None:
        raise TargetUnavailable(f"no PyTorchJob CRD to check against: set {CRD_ENV} to a copy of {CRD_NAME}")
    return _load_crd(str(path))


def validate_pytorchjob(obj: dict[str, Any], crd_path: str | os.PathLike[str] | None = None) -> list[SchemaIssue]:
    """Every problem the API server (strict) or the operator's webhook would report, in path order."""
    import jsonschema

    sch = schema(crd_path)
    checker = jsonschema.FormatChecker()
    for fmt, (lo, hi) in INT_RANGES.items():
        checker.checks(fmt)(lambda v, lo=lo, hi=hi: not isinstance(v, int) or isinstance(v, bool) or lo <= v <= hi)
    validator = jsonschema.Draft7Validator(sch, format_checker=checker)
    issues = []
    for err in validator.iter_errors(obj):
        path = tuple(err.absolute_path)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            for key in extra:
                known = sorted(err.schema.get("properties", {}))
                issues.append(SchemaIssue(path + (key,), f"unknown field {key!r} (known: {', '.join(known[:12])}{'...' if len(known) > 12 else ''})"))
            continue
        if err.validator == "format":
            issues.append(SchemaIssue(path, f"{err.instance!r} is out of range for {err.validator_value}"))
            continue
        if err.validator == "anyOf" and isinstance(err.instance, float):
            issues.append(SchemaIssue(path, f"{err.instance!r} is not a valid quantity: write it as a string, e.g. \"500m\" or \"0.5\""))
            continue
        issues.append(SchemaIssue(path, err.message))
    issues += _list_map_issues(sch, obj, ())
    issues += _metadata_issues(obj.get("metadata"))
    issues += _webhook_issues(obj)
    return sorted(set(issues), key=lambda i: [str(p) for p in i.path])


def _list_map_issues(sch: Any, obj: Any, path: Path_) -> list[SchemaIssue]:
    out: list[SchemaIssue] = []
    if not isinstance(sch, dict):
        return out
    if isinstance(obj, list):
        item_schema = sch.get("items", {})
        if sch.get("x-kubernetes-list-type") == "map":
            keys = sch.get("x-kubernetes-list-map-keys", [])
            defaults = {k: item_schema.get("properties", {}).get(k, {}).get("default") for k in keys}
            seen: dict[tuple[Any, ...], int] = {}
            for i, item in enumerate(obj):
                if not isinstance(item, dict):
                    continue
                key = tuple(item.get(k, defaults[k]) for k in keys)
                if key in seen:
                    shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, key))
                    out.append(SchemaIssue(path + (i,), f"duplicate entry ({shown}) also at index {seen[key]}"))
                else:
                    seen[key] = i
        elif sch.get("x-kubernetes-list-type") == "set":
            if len({repr(x) for x in obj}) != len(obj):
                out.append(SchemaIssue(path, "duplicate values in a set"))
        for i, item in enumerate(obj):
            out += _list_map_issues(item_schema, item, path + (i,))
    elif isinstance(obj, dict):
        props = sch.get("properties")
        if props:
            for k, v in obj.items():
                if k in props:
                    out += _list_map_issues(props[k], v, path + (k,))
        elif isinstance(sch.get("additionalProperties"), dict):
            for k, v in obj.items():
                out += _list_map_issues(sch["additionalProperties"], v, path + (k,))
    return out


def _metadata_issues(meta: Any) -> list[SchemaIssue]:
    p: Path_ = ("metadata",)
    if not isinstance(meta, dict):
        return [SchemaIssue(p, "metadata must be an object with at least a name")]
    out = [SchemaIssue(p + (k,), f"unknown field {k!r} in metadata") for k in meta if k not in METADATA_FIELDS]
    for field in ("labels", "annotations"):
        values = meta.get(field, {})
        if not isinstance(values, dict):
            out.append(SchemaIssue(p + (field,), "must be a map of strings"))
            continue
        for k, v in values.items():
            prefix, _, name = str(k).rpartition("/")
            if (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))) or len(name) > 63 or not LABEL_NAME.match(name):
                out.append(SchemaIssue(p + (field, k), f"invalid key {k!r}: [prefix/]name, name <= 63 characters of [A-Za-z0-9_.-]"))
            if not isinstance(v, str):
                out.append(SchemaIssue(p + (field, k), f"value must be a string, not {type(v).__name__}"))
            elif field == "labels" and (len(v) > 63 or not LABEL_VALUE.match(v)):
                out.append(SchemaIssue(p + (field, k), f"invalid label value {v!r}: at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends"))
    return out


def _webhook_issues(obj: dict[str, Any]) -> list[SchemaIssue]:
    out: list[SchemaIssue] = []
    if obj.get("apiVersion") != "kubeflow.org/v1":
        out.append(SchemaIssue(("apiVersion",), "must be kubeflow.org/v1"))
    if obj.get("kind") != "PyTorchJob":
        out.append(SchemaIssue(("kind",), "must be PyTorchJob"))
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    replicas = spec.get("pytorchReplicaSpecs") if isinstance(spec.get("pytorchReplicaSpecs"), dict) else {}
    name = (obj.get("metadata") or {}).get("name", "") if isinstance(obj.get("metadata"), dict) else ""
    if not isinstance(name, str) or not DNS1035.match(name):
        out.append(SchemaIssue(("metadata", "name"), f"{name!r} is not a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)"))
    workers = replicas.get("Worker", {}).get("replicas", 1) if isinstance(replicas.get("Worker"), dict) else 0
    longest = f"{name}-worker-{max(0, int(workers) - 1)}" if isinstance(workers, int) and workers > 0 else f"{name}-master-0"
    if isinstance(name, str) and len(longest) > 63:
        out.append(SchemaIssue(("metadata", "name"), f"too long: the per-pod service {longest!r} would have {len(longest)} characters (at most 63)"))
    if not replicas:
        out.append(SchemaIssue(("spec", "pytorchReplicaSpecs"), "needs a Master replica"))
    for key, rs in replicas.items():
        rp: Path_ = ("spec", "pytorchReplicaSpecs", key)
        if key not in ("Master", "Worker"):
            out.append(SchemaIssue(rp, f"unknown replica type {key!r}: use Master and Worker"))
            continue
        if not isinstance(rs, dict):
            continue
        n = rs.get("replicas", 1)
        if key == "Master" and n != 1:
            out.append(SchemaIssue(rp + ("replicas",), f"Master must have exactly 1 replica, not {n}"))
        if key == "Worker" and isinstance(n, int) and n < 1:
            out.append(SchemaIssue(rp + ("replicas",), "Worker needs at least 1 replica (omit Worker for a 1-node job)"))
        policy = rs.get("restartPolicy")
        if policy is not None and policy not in ENUMS[("restartPolicy",)]:
            out.append(SchemaIssue(rp + ("restartPolicy",), f"{policy!r} is not one of {sorted(ENUMS[('restartPolicy',)])}"))
        containers = ((rs.get("template") or {}).get("spec") or {}).get("containers") or []
        pytorch = [c for c in containers if isinstance(c, dict) and c.get("name") == "pytorch"]
        if not pytorch:
            out.append(SchemaIssue(rp + ("template", "spec", "containers"), "needs a container named 'pytorch' (the operator injects its environment there)"))
        for i, c in enumerate(containers):
            if isinstance(c, dict) and c.get("name") == "pytorch" and not c.get("image"):
                out.append(SchemaIssue(rp + ("template", "spec", "containers", i, "image"), "the pytorch container needs an image"))
            for j, port in enumerate(c.get("ports", []) if isinstance(c, dict) else []):
                if isinstance(port, dict) and len(str(port.get("name", ""))) > 15:
                    out.append(SchemaIssue(rp + ("template", "spec", "containers", i, "ports", j, "name"), "port names have at most 15 characters"))
    if "Master" not in replicas and replicas:
        out.append(SchemaIssue(("spec", "pytorchReplicaSpecs"), "needs a Master replica: without it the operator injects no MASTER_ADDR, RANK or WORLD_SIZE"))
    run_policy = spec.get("runPolicy") if isinstance(spec.get("runPolicy"), dict) else {}
    cpp = run_policy.get("cleanPodPolicy")
    if cpp is not None and cpp not in ENUMS[("cleanPodPolicy",)]:
        out.append(SchemaIssue(("spec", "runPolicy", "cleanPodPolicy"), f"{cpp!r} is not one of {sorted(ENUMS[('cleanPodPolicy',)])}"))
    elastic = spec.get("elasticPolicy")
    if isinstance(elastic, dict):
        ep: Path_ = ("spec", "elasticPolicy")
        if elastic.get("standalone"):
            out.append(SchemaIssue(ep + ("standalone",), "standalone breaks torchrun (the operator sets PET_STANDALONE=\"\", which torchrun cannot parse)"))
        if "Worker" not in replicas:
            out.append(SchemaIssue(ep, "an elastic job needs a Worker replica"))
        if "nProcPerNode" in elastic and "nprocPerNode" in spec:
            out.append(SchemaIssue(ep + ("nProcPerNode",), "set spec.nprocPerNode or elasticPolicy.nProcPerNode, not both"))
        backend = elastic.get("rdzvBackend")
        if backend is not None and backend not in ENUMS[("rdzvBackend",)]:
            out.append(SchemaIssue(ep + ("rdzvBackend",), f"{backend!r} is not one of {sorted(ENUMS[('rdzvBackend',)])}"))
    return out
