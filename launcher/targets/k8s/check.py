"""The k8s plan's checks and the API server's verdicts, both reported at the spec's file:line:field.

``check_manifests`` runs while planning (pure: the CRD arrives as ``CrdInput``): the structural
checks always, the strict CRD check when there is a CRD. ``spec_where`` records, at plan time,
where each spec field that a manifest path maps to was written (``file:line:col``, or the
``--set`` that gave it), so that ``located`` can point a 422 from the API server (its dry run or
its create) at the spec, long after the ``LoadedSpec`` is gone.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from launcher.core.errors import Issue, dotted_path
from launcher.targets.k8s.options import is_operator_env
from launcher.targets.k8s.render import FIELD_TARGETS, SERVICE_NAME_MAX, job_name, spec_field

if TYPE_CHECKING:
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.k8s.client import InvalidObject
    from launcher.targets.k8s.crd import CrdInput

_PATH_PART = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


def spec_issues(spec: JobSpec, job_id: str) -> list[Issue]:
    """Kubernetes-specific problems found from the spec alone, each at the field that causes it."""
    issues: list[Issue] = []
    if not spec.image:
        issues.append(Issue(("image",), "the k8s target needs an image (the pytorch container's image)",
                            hint="add e.g. `image: ghcr.io/ddpjob/train:0.1.0` (see docker/README.md)"))
    for name in spec.env:
        if is_operator_env(name):
            issues.append(Issue(("env", name), f"{name} is set by the training operator in every pod, after your env, "
                                "so your value would be silently replaced (k8s/README.md lists these variables)",
                                hint="remove it from env: for the k8s target"))
    plain = set(spec.env) | {"DDPJOB_JOB_ID", "DDPJOB_SWEEP_INDEX", "DDPJOB_OUTPUT_DIR"}
    for name in spec.k8s.env_refs:
        if name in plain:
            issues.append(Issue(("k8s", "env_refs", name), f"{name} is also set in env: (a duplicate env name is rejected by the API server)",
                                hint="keep one of them"))
    if "runtime" in spec.k8s.model_fields_set:
        issues.append(Issue(("k8s", "runtime"), "a training runtime is used only by k8s.api trainjob (a PyTorchJob has none)",
                            hint="set k8s.api: trainjob, or remove k8s.runtime"))
    e = spec.k8s.elastic
    if e is not None:
        if spec.nodes < 2:
            issues.append(Issue(("k8s", "elastic"), "an elastic job needs nodes >= 2 (the operator's rendezvous runs on a Worker)"))
        if not e.min_nodes <= spec.nodes <= e.max_nodes:
            issues.append(Issue(("nodes",), f"nodes={spec.nodes} is outside k8s.elastic {e.min_nodes}..{e.max_nodes}"))
    runs = 1
    for values in spec.sweep.values():
        runs *= len(values)
    longest = f"{job_name(job_id, runs - 1, bool(spec.sweep))}-worker-{max(0, spec.nodes - 2)}"
    if len(longest) > SERVICE_NAME_MAX:
        issues.append(Issue(("name",), f"too long for Kubernetes: the per-pod service {longest!r} has {len(longest)} "
                            f"characters (at most {SERVICE_NAME_MAX})", hint="use a shorter name"))
    return issues


def check_manifests(loaded: LoadedSpec, objects: list[dict[str, Any]], crd: CrdInput) -> None:
    """Raise ``SpecError`` (every problem, at its spec field) if a PyTorchJob fails a check."""
    from launcher.targets.k8s.schema import validate_pytorchjob

    spec = loaded.spec
    found: dict[tuple[Any, ...], Issue] = {}
    for obj in objects:
        for si in validate_pytorchjob(obj, crd.schema):
            path = spec_field(si.path, spec)
            message = f"the PyTorchJob's {dotted_path(si.path)}: {si.message}"
            # The same problem in the Master and the Worker template is one problem of the spec.
            found.setdefault((path, dotted_path(si.path[:2] + si.path[3:]), si.message), Issue(path, message))
    if found:
        raise loaded.error(list(found.values()))


def spec_where(loaded: LoadedSpec, targets: list[tuple[str | int, ...]] | None = None) -> dict[str, str]:
    """``{spec field: where it was written}`` for every field a manifest path maps to."""
    out = {}
    for path in FIELD_TARGETS if targets is None else targets:
        dotted = dotted_path(path)
        # SpecError decides where an issue is (file:line:col, the --set that gave it, the file, or the
        # command line); an issue with an empty message renders as "<where>: <field>: ".
        line = loaded.error([Issue(path, "")]).render().splitlines()[0]
        out[dotted] = line[: -len(f": {dotted}: ")]
    return out


def parse_field(field: str) -> tuple[str | int, ...]:
    """``spec.x.containers[0].env[3].name`` -> ``("spec", "x", "containers", 0, "env", 3, "name")``."""
    out: list[str | int] = []
    for name, index in _PATH_PART.findall(field.lstrip(".")):
        if name:
            out.append(name)
        else:
            out.append(int(index) if index.isdigit() else index)
    return tuple(out)


def located(e: InvalidObject, where: dict[str, str], k8s_cpu: bool, *, dry_run: bool,
            kind: str = "PyTorchJob", field_of: Any = None) -> InvalidObject:
    """``e`` (a 422 from the API server) with each cause at the spec field it comes from."""
    from launcher.targets.k8s.client import InvalidObject

    lines: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for field, message in e.causes:
        path = parse_field(field) if field else ()
        key = (path[:2] + path[3:], message)
        if key in seen:
            continue
        seen.add(key)
        if not path:
            lines.append(f"  {message}")
            continue
        target = dotted_path((field_of or spec_field)(path, k8s_cpu=k8s_cpu))
        lines.append(f"{where.get(target, '<spec>')}: {target}: the {kind}'s {field}: {message}")
    when = "in a server-side dry run (dryRun=All); nothing was created" if dry_run else "on create"
    head = f"the API server rejected {kind} {e.name!r} ({e.status}) {when}"
    text = "\n".join([f"{head}:", *lines, f"  the server said: {e.server}"]) if lines else f"{head}: {e.server}"
    return InvalidObject(text, name=e.name, status=e.status, server=e.server, causes=e.causes)
