"""The k8s plan's checks and the API server's verdicts, both reported at the spec's file:line:field.

``check_objects`` runs while planning (pure): a flavour's structural checks always, the strict
CRD check when there is a CRD (``flavours``). ``spec_where`` records, at plan time,
where each spec field that a manifest path maps to was written (``file:line:col``, or the
``--set`` that gave it), so that ``located`` can point a 422 from the API server (its dry run or
its create) at the spec, long after the ``LoadedSpec`` is gone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from launcher.core.errors import Issue, dotted_path

if TYPE_CHECKING:
    from launcher.core.jsondata import JSONObject
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.k8s.cluster.client import InvalidObject
    from launcher.targets.k8s.validation.schema import SchemaIssue

SpecPath = tuple[str | int, ...]


class SpecFieldOf(Protocol):
    """A flavour's ``spec_field``: an object path -> the spec field behind it (``k8s_cpu``: the CPU
    request comes from ``k8s.cpu``; taken from ``spec`` when given)."""

    def __call__(self, path: SpecPath, spec: JobSpec | None = None, *, k8s_cpu: bool | None = None) -> SpecPath: ...


_PATH_PART = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


def check_objects(loaded: LoadedSpec, objects: list[JSONObject], kind: str,
                  problems: Callable[[JSONObject], list[SchemaIssue]], field_of: SpecFieldOf,
                  same: Callable[[SpecPath], SpecPath] = lambda path: path) -> None:
    """Raise ``SpecError`` (every problem, at its spec field) if one of ``objects`` has ``problems``.

    Args:
        field_of: the flavour's ``spec_field``.
        same: the key under which problems at different paths are one problem of the spec.
    """
    found: dict[tuple[SpecPath, str, str], Issue] = {}
    for obj in objects:
        for si in problems(obj):
            path = field_of(si.path, loaded.spec)
            found.setdefault((path, dotted_path(same(si.path)), si.message),
                             Issue(path, f"the {kind}'s {dotted_path(si.path)}: {si.message}"))
    if found:
        raise loaded.error(list(found.values()))


def spec_where(loaded: LoadedSpec, targets: list[SpecPath]) -> dict[str, str]:
    """``{spec field: where it was written}`` for every field in ``targets`` (a flavour's ``FIELD_TARGETS``)."""
    out = {}
    for path in targets:
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


def located(e: InvalidObject, where: dict[str, str], k8s_cpu: bool, *, dry_run: bool, kind: str,
            field_of: SpecFieldOf) -> InvalidObject:
    """``e`` (a 422 from the API server) with each cause at the spec field it comes from."""
    from launcher.targets.k8s.cluster.client import InvalidObject

    lines: list[str] = []
    seen: set[tuple[SpecPath, str]] = set()
    for field, message in e.causes:
        path = parse_field(field) if field else ()
        key = (path[:2] + path[3:], message)
        if key in seen:
            continue
        seen.add(key)
        if not path:
            lines.append(f"  {message}")
            continue
        target = dotted_path(field_of(path, k8s_cpu=k8s_cpu))
        lines.append(f"{where.get(target, '<spec>')}: {target}: the {kind}'s {field}: {message}")
    when = "in a server-side dry run (dryRun=All); nothing was created" if dry_run else "on create"
    head = f"the API server rejected {kind} {e.name!r} ({e.status}) {when}"
    text = "\n".join([f"{head}:", *lines, f"  the server said: {e.server}"]) if lines else f"{head}: {e.server}"
    return InvalidObject(text, name=e.name, status=e.status, server=e.server, causes=e.causes)
