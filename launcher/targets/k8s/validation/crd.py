"""The PyTorchJob CRD the strict check runs against: an input of the plan, read before planning.

``KubernetesTarget.inputs`` calls ``online`` (submit, ``--dry-run=server``) or ``offline``
(render, validate, ``--dry-run``); the ``CrdInput`` it returns reaches ``plan`` through
``PlanContext.inputs``. ``plan`` itself reads no file and asks no cluster.

- online: the cluster's own CRD (``customresourcedefinitions/pytorchjobs.kubeflow.org``), i.e. the
  one of the operator installed there. Not there (404): the training operator is not installed,
  ``OperatorMissing`` (exit 6) before anything is created. Not readable (403: a namespaced Role
  cannot read cluster-scoped CRDs): the offline copy is used and the plan says why. Every CRD read
  from a cluster is cached under ``$DDPJOB_HOME/crds/`` keyed by its name, version and content hash.
- offline: ``$DDPJOB_PYTORCHJOB_CRD`` (set but not a file: no strict check, never another copy
  instead), else the CRD cached most recently from a cluster, else none: the structural checks
  still run and the plan says ``strict CRD check skipped`` and how to enable it.

Parsing the CRD's YAML (0.6 MB) costs more than a whole render, so a file's parsed schema is
cached too (``crds/files/<sha256 of the file>.json``). Schemas are stored without descriptions.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import SchedulerComponentMissing, TargetUnavailable
from launcher.core.jsondata import JSON, JSONObject, obj, text
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi
from launcher.targets.k8s.validation.schema import strict_schema, version_schema

if TYPE_CHECKING:
    from launcher.targets.k8s.cluster.client import Kube

CACHE_FORMAT = 1


def how_to_enable(api: KubeflowApi) -> str:
    return ("to enable it, connect once to your cluster (`ddpjob submit SPEC -t k8s --dry-run=server` caches its CRD) "
            f"or set {api.crd_env} to a copy of {api.crd_file}")
# Strict schemas by content hash: one process (a test run, a sweep of validations) derives each once.
_STRICT: dict[str, JSONObject] = {}
_NAMES: dict[str, str] = {}  # content hash -> the CRD's name (a file given for the wrong API is refused)


@dataclass(frozen=True)
class CrdInput:
    """The CRD a plan is checked against, or why there is none.

    Attributes:
        schema: the strict schema of the CRD's v1 version (``schema.strict_schema``); None when
            the strict check is skipped.
        sha256: the content hash of the CRD (a file's bytes, or the schema read from a cluster).
        origin: where it came from, in words (``$DDPJOB_PYTORCHJOB_CRD (/path)``, a cluster, the cache).
        skipped: without a schema, why the strict check is skipped and how to enable it.
    """

    schema: JSONObject | None = None
    sha256: str = ""
    origin: str = ""
    skipped: str = ""
    api: KubeflowApi = PYTORCHJOB

    def note(self) -> str:
        """The plan's header line."""
        rules = "the training operator's rules" if self.api is PYTORCHJOB else "Trainer v2's webhook and JobSet rules"
        if self.schema is not None:
            return f"checked: {self.api.kind} CRD schema (strict) and {rules}"
        return f"checked: {rules} only; strict CRD check skipped: {self.skipped}"

    def summary(self) -> str:
        """What ``ddpjob validate --target k8s`` says was checked."""
        if self.schema is not None:
            return f"k8s checks passed, strict CRD check ran against {self.api.crd_name} {self.api.version} from {self.origin}"
        return f"structural k8s checks only; strict CRD check skipped: {self.skipped}"


def absent(why: str, api: KubeflowApi = PYTORCHJOB) -> CrdInput:
    """No CRD: the structural checks only."""
    return CrdInput(skipped=f"{why}; {how_to_enable(api)}", api=api)


def cache_dir() -> Path:
    from launcher.core.home import ddpjob_home

    return ddpjob_home() / "crds"


# --------------------------------------------------------------------------- offline

def offline(note: str = "", api: KubeflowApi = PYTORCHJOB) -> CrdInput:
    """``$DDPJOB_PYTORCHJOB_CRD`` (``$DDPJOB_TRAINJOB_CRD`` for TrainJobs), else the newest CRD cached
    from a cluster, else none.

    Args:
        note: why the cluster's own CRD is not used, added to what the plan says (online fallback).
    """
    suffix = f" ({note})" if note else ""
    env = os.environ.get(api.crd_env)
    found: CrdInput | None
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            return absent(f"{api.crd_env}={env} is not a file" + suffix, api)
        found = from_file(path, api)
    else:
        found = latest_cached(api)
        if found is None:
            return absent(f"no {api.kind} CRD here ({api.crd_env} unset, no cluster's CRD cached)" + suffix, api)
    return CrdInput(found.schema, found.sha256, found.origin + suffix, api=api)


def from_file(path: Path, api: KubeflowApi = PYTORCHJOB) -> CrdInput:
    """A CRD file (YAML), through the parse cache. ``TargetUnavailable`` if it is not ``api``'s CRD."""
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    origin = f"${api.crd_env} ({path})"
    if sha in _STRICT and _NAMES.get(sha) == api.crd_name:
        return CrdInput(_STRICT[sha], sha, origin, api=api)
    entry = _read_entry(cache_dir() / "files" / f"{sha[:32]}.json", sha, api)
    if entry is not None:
        return _input(obj(entry["schema"]), sha, origin, api)
    import yaml

    try:
        crd = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        raw = _checked(crd, api)
    except (yaml.YAMLError, ValueError) as e:
        raise TargetUnavailable(f"{api.crd_env}={path} is not the {api.kind} CRD ({api.crd_file}): {e}") from e
    _write_entry(cache_dir() / "files" / f"{sha[:32]}.json", raw, sha, str(path), api)
    return _input(raw, sha, origin, api)


def latest_cached(api: KubeflowApi = PYTORCHJOB) -> CrdInput | None:
    """The CRD most recently read from a cluster, or None."""
    try:
        paths = sorted(cache_dir().glob(f"{api.crd_name}_{api.version}_*.json"), key=lambda p: p.stat().st_mtime,
                       reverse=True)
    except OSError:
        return None
    for path in paths:
        entry = _read_entry(path, None, api)
        if entry is not None:
            return _input(obj(entry["schema"]), text(entry["sha256"]),
                          f"the CRD cached from {entry['source']} at {entry['read_at']}", api)
    return None


# --------------------------------------------------------------------------- online

def online(kube: Kube, api: KubeflowApi = PYTORCHJOB) -> CrdInput:
    """The cluster's own CRD (``kube``: a ``client.Kube``), cached for offline use.

    Raises:
        OperatorMissing: the cluster has no such CRD (exit 6), or none with the version ddpjob speaks.
    """
    from launcher.core.errors import PermissionDenied
    from launcher.targets.k8s.cluster.client import operator_missing

    try:
        crd = kube.read_crd(api.crd_name)
    except PermissionDenied as e:
        return offline(note=f"the cluster's CRD could not be read: {str(e).splitlines()[0]}", api=api)
    if crd is None:
        raise operator_missing(kube.host, api)
    try:
        raw = _checked(crd, api)
    except ValueError as e:
        needs = ("kubeflow.org/v1 API of the training operator v1.9.x" if api is PYTORCHJOB
                 else f"{api.api_version} API of Kubeflow Trainer v2.3")
        raise SchedulerComponentMissing(
            f"the cluster {kube.host} has a {api.crd_name} CRD that ddpjob cannot use ({e}); ddpjob needs the "
            f"{needs} (see k8s/README.md: ddpjob docs k8s/README.md prints it)"
        ) from e
    sha = _hash(raw)
    source = f"the cluster {kube.host} (context {kube.context})"
    path = cache_dir() / f"{api.crd_name}_{api.version}_{sha[:32]}.json"
    if _read_entry(path, sha, api) is not None:
        try:
            os.utime(path)  # the newest read is what offline checks use
        except OSError:
            pass
    else:
        _write_entry(path, raw, sha, source, api)
    return _input(raw, sha, source, api)


# --------------------------------------------------------------------------- plumbing

def _checked(crd: object, api: KubeflowApi = PYTORCHJOB) -> JSONObject:
    """The schema of ``api``'s version in its CRD without descriptions; ValueError for anything else."""
    name = (crd.get("metadata") or {}).get("name") if isinstance(crd, dict) else None
    if name != api.crd_name:
        raise ValueError(f"its metadata.name is {name!r}, not {api.crd_name!r}")
    return {k: _slim(v) for k, v in version_schema(crd, api.version).items() if not _description(k, v)}


def _slim(node: JSON) -> JSON:
    if isinstance(node, dict):
        return {k: _slim(v) for k, v in node.items() if not _description(k, v)}
    if isinstance(node, list):
        return [_slim(v) for v in node]
    return node


def _description(key: str, value: JSON) -> bool:
    return key == "description" and isinstance(value, str)


def _hash(raw: JSONObject) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _input(raw: JSONObject, sha: str, origin: str, api: KubeflowApi = PYTORCHJOB) -> CrdInput:
    if sha not in _STRICT:
        _STRICT[sha] = strict_schema(raw, in_place=True)  # raw was just parsed: nobody else holds it
        _NAMES[sha] = api.crd_name
    return CrdInput(_STRICT[sha], sha, origin, api=api)


def _read_entry(path: Path, sha: str | None, api: KubeflowApi = PYTORCHJOB) -> JSONObject | None:
    """The cache entry in ``path`` if it is one of ``api``'s CRD (with the content hash ``sha`` when given)."""
    from launcher.targets.shared.files import read_json

    entry: object = read_json(path)
    if not isinstance(entry, dict):
        return None
    ok = (entry.get("format") == CACHE_FORMAT and isinstance(entry.get("schema"), dict)
          and isinstance(entry.get("sha256"), str) and (sha is None or entry["sha256"] == sha)
          and entry.get("name", PYTORCHJOB.crd_name) == api.crd_name)
    return entry if ok else None


def _write_entry(path: Path, raw: JSONObject, sha: str, source: str, api: KubeflowApi = PYTORCHJOB) -> None:
    """Best effort: without a writable home the check still runs, it is only not remembered."""
    from launcher.targets.shared.files import atomic_write

    entry = {"format": CACHE_FORMAT, "name": api.crd_name, "version": api.version, "sha256": sha, "source": source,
             "read_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "schema": raw}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(entry, separators=(",", ":")))
    except OSError:
        pass
