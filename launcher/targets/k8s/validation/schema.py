"""Strict validation of a PyTorchJob against a PyTorchJob CRD's schema, plus the operator's own rules.

Pure functions: the CRD's schema is an argument (``launcher.targets.k8s.validation.crd`` finds it: the
cluster's own, ``$DDPJOB_PYTORCHJOB_CRD`` or the cache), never a file read here. Two layers:

- **structural** (always, no CRD needed): ``metadata`` (name, label and annotation syntax) and the
  training operator webhook's rules: DNS-1035 names short enough for ``<job>-worker-<N>`` services,
  replica keys ``Master``/``Worker``, a ``pytorch`` container with an image, ``Master.replicas == 1``,
  enum-like fields the schema leaves as free strings, and ``elasticPolicy.standalone`` refused
  (``PET_STANDALONE=""`` makes torchrun fail parsing its arguments);
- **strict** (with a CRD): JSON Schema validation plus what plain JSON Schema misses of the API
  server: unknown fields rejected (``additionalProperties: false`` on every object with properties,
  as ``fieldValidation=Strict`` does), ``int32``/``int64`` ranges, and ``x-kubernetes-list-type: map``
  key uniqueness (duplicate env names, container ports ...) after applying the schema's defaults to
  key fields (a port's ``protocol`` defaults to TCP).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.core.errors import dotted_path
from launcher.core.jsondata import JSON, JSONObject, arr, at
from launcher.core.jsondata import obj as _object

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

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class SchemaIssue:
    """One problem: ``path`` into the PyTorchJob object and what is wrong there."""

    path: Path_
    message: str

    def __str__(self) -> str:
        return f"{dotted_path(self.path)}: {self.message}"


def version_schema(crd: object, version: str) -> JSONObject:
    """The ``openAPIV3Schema`` of ``version`` in a CustomResourceDefinition; ValueError if it has none."""
    for v in arr(at(crd, "spec", "versions")):
        if isinstance(v, dict) and v.get("name") == version:
            found = at(v, "schema", "openAPIV3Schema")
            if isinstance(found, dict):
                return found
    raise ValueError(f"the CustomResourceDefinition has no {version} version with a schema")


def strict_schema(openapi: JSONObject, *, in_place: bool = False) -> JSONObject:
    """A copy of a CRD's schema where every object with properties refuses unknown fields (what
    ``fieldValidation=Strict`` does), except where the schema keeps unknown fields itself.

    Args:
        in_place: change ``openapi`` itself (a schema just parsed, that nobody else holds).
    """
    node = openapi if in_place else copy.deepcopy(openapi)

    def walk(n: JSON) -> None:
        if isinstance(n, dict):
            if (n.get("type") == "object" and "properties" in n and "additionalProperties" not in n
                    and not n.get("x-kubernetes-preserve-unknown-fields")):
                n["additionalProperties"] = False
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    walk(node)
    return node


def validate_pytorchjob(obj: Mapping[str, JSON], schema: Mapping[str, JSON] | None) -> list[SchemaIssue]:
    """Every problem the API server (strict) or the operator's webhook would report, in path order
    (then by message: the same order in every process).

    Args:
        schema: a strict schema (``strict_schema``) of the PyTorchJob CRD, or None: the structural
            checks only.
    """
    issues = structural_issues(obj) + (strict_issues(obj, schema) if schema is not None else [])
    return sorted(set(issues), key=lambda i: ([str(p) for p in i.path], i.message))


def structural_issues(obj: Mapping[str, JSON]) -> list[SchemaIssue]:
    """What needs no CRD: metadata syntax and the training operator's rules."""
    return _metadata_issues(obj.get("metadata")) + _webhook_issues(obj)


def strict_issues(obj: Mapping[str, JSON], schema: Mapping[str, JSON]) -> list[SchemaIssue]:
    """The CRD's schema, strictly: unknown fields, types, int ranges, list-map keys."""
    from launcher.targets.k8s.validation.structural import errors

    issues = []
    for path, keyword, message in errors(obj, schema):
        instance = _at(obj, path)
        if keyword == "anyOf" and isinstance(instance, float):
            message = f"{instance!r} is not a valid quantity: write it as a string, e.g. \"500m\" or \"0.5\""
        issues.append(SchemaIssue(path, message))
    return issues + _list_map_issues(schema, obj, ())


def _at(value: object, path: Path_) -> object:
    """The value at ``path``, one of the paths ``structural.errors`` gives (always in ``value``)."""
    for part in path:
        if isinstance(value, Mapping):
            value = value[part]
            continue
        if not (isinstance(value, list) and isinstance(part, int)):
            raise TypeError(f"no {part!r} in {value!r}")
        value = value[part]
    return value


def _list_map_issues(sch: object, obj: object, path: Path_) -> list[SchemaIssue]:
    out: list[SchemaIssue] = []
    if not isinstance(sch, dict):
        return out
    if isinstance(obj, list):
        item_schema = sch.get("items", {})
        if sch.get("x-kubernetes-list-type") == "map":
            keys = sch.get("x-kubernetes-list-map-keys", [])
            defaults = {k: item_schema.get("properties", {}).get(k, {}).get("default") for k in keys}
            seen: dict[str, int] = {}
            for i, item in enumerate(obj):
                if not isinstance(item, dict):
                    continue
                key = tuple(item.get(k, defaults[k]) for k in keys)
                ident = json.dumps(key, sort_keys=True, default=repr)  # a key's value may be a list or an object
                if ident in seen:
                    shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, key))
                    out.append(SchemaIssue(path + (i,), f"duplicate entry ({shown}) also at index {seen[ident]}"))
                else:
                    seen[ident] = i
        elif sch.get("x-kubernetes-list-type") == "set" and len({repr(x) for x in obj}) != len(obj):
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


def _metadata_issues(meta: object) -> list[SchemaIssue]:
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


def _webhook_issues(obj: Mapping[str, JSON]) -> list[SchemaIssue]:
    out: list[SchemaIssue] = []
    if obj.get("apiVersion") != "kubeflow.org/v1":
        out.append(SchemaIssue(("apiVersion",), "must be kubeflow.org/v1"))
    if obj.get("kind") != "PyTorchJob":
        out.append(SchemaIssue(("kind",), "must be PyTorchJob"))
    spec = _object(obj.get("spec"))
    replicas = _object(spec.get("pytorchReplicaSpecs"))
    meta = obj.get("metadata")
    name = meta.get("name", "") if isinstance(meta, dict) else ""
    if not isinstance(name, str) or not DNS1035.match(name):
        out.append(SchemaIssue(("metadata", "name"), f"{name!r} is not a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)"))
    worker = replicas.get("Worker")
    workers = worker.get("replicas", 1) if isinstance(worker, dict) else 0
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
        containers = arr(at(rs, "template", "spec", "containers"))
        pytorch = [c for c in containers if isinstance(c, dict) and c.get("name") == "pytorch"]
        if not pytorch:
            out.append(SchemaIssue(rp + ("template", "spec", "containers"), "needs a container named 'pytorch' (the operator injects its environment there)"))
        for i, c in enumerate(containers):
            if isinstance(c, dict) and c.get("name") == "pytorch" and not c.get("image"):
                out.append(SchemaIssue(rp + ("template", "spec", "containers", i, "image"), "the pytorch container needs an image"))
            for j, port in enumerate(arr(c.get("ports", [])) if isinstance(c, dict) else []):
                if isinstance(port, dict) and len(str(port.get("name", ""))) > 15:
                    out.append(SchemaIssue(rp + ("template", "spec", "containers", i, "ports", j, "name"), "port names have at most 15 characters"))
    if "Master" not in replicas and replicas:
        out.append(SchemaIssue(("spec", "pytorchReplicaSpecs"), "needs a Master replica: without it the operator injects no MASTER_ADDR, RANK or WORLD_SIZE"))
    run_policy = _object(spec.get("runPolicy"))
    cpp = run_policy.get("cleanPodPolicy")
    if cpp is not None and (not isinstance(cpp, str) or cpp not in ENUMS[("cleanPodPolicy",)]):
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
