"""The k8s target's request and handle, and the request's text: what ``plan`` builds, ``submit``
creates (and writes to ``plan.json``), and what ``render``, ``--dry-run`` and ``plan.txt`` show.

The text is multi-document YAML of the very objects sent (``metadata.namespace`` apart, filled at
submit from the kubeconfig context when the spec has none; the pod runner's code shortened to its
size and digest, see ``runner``), under a comment header.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from launcher.core.jsondata import JSON, JSONObject
from launcher.spec.secrets import shown_value
from launcher.targets.base import Handle
from launcher.targets.k8s.objects.apis import api_of
from launcher.targets.k8s.objects.runner import BUNDLE_ENV, shown


@dataclass
class K8sElement:
    """One run (sweep element) and the name of its object."""

    index: int
    name: str
    params: dict[str, str]
    output_dir: str


@dataclass
class K8sPayload:
    """The objects ``submit`` creates, in order, and what the handle needs about them.

    ``checks`` says what the plan was checked against (``ddpjob validate`` prints it) and ``notes``
    what the text's header adds; ``where`` maps spec fields to where they were written, and
    ``k8s_cpu`` whether the CPU request is ``k8s.cpu``, so that a 422 from the API server points at
    the spec (``check.located``).
    """

    job_id: str
    run_dir: str
    nodes: int
    procs_per_node: int
    namespace: str | None
    context: str | None
    elements: list[K8sElement]
    manifests: list[JSONObject]
    checks: str = ""
    where: dict[str, str] = field(default_factory=dict)
    k8s_cpu: bool = False
    api: str = "pytorchjob"
    notes: list[str] = field(default_factory=list)
    runs: int = 0  # the objects made (one per run): the header's count when a render shows the first runs only
    watch_port: int = 0  # where the first pod's runner serves watch.json (0: no pod runner)


@dataclass
class K8sRun:
    """One run's object."""

    index: int
    name: str
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class K8sHandle(Handle):
    """Where the objects are (the context and namespace used at submit) and their names."""

    context: str | None = None
    namespace: str = "default"
    nodes: int = 1
    procs_per_node: int = 1
    elastic: bool = False
    jobs: list[K8sRun] = field(default_factory=list)
    api: str = "pytorchjob"  # k8s.api at submit: which custom resource the jobs are
    watch_port: int = 0  # the first pod's runner serves watch.json there (0: no pod runner)

    def native_ids(self) -> list[str]:
        return [run.name for run in self.jobs]


# --------------------------------------------------------------------------- text

if TYPE_CHECKING:
    _SafeDumper = yaml.SafeDumper
else:
    _SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: 10x faster, and exact


class _NoAliasDumper(_SafeDumper):
    """Never emit anchors/aliases: shared dicts are written out in full, as kubectl shows them."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_NoAliasDumper.add_representer(str, _str_presenter)


def to_yaml(obj: JSON) -> str:
    """One manifest as YAML (key order as built, which is fixed; no aliases; wide lines)."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=4096,
                     allow_unicode=True)


def masked_env(obj: JSON, masked: frozenset[str]) -> JSON:
    """``obj`` with the value of every container env entry named in ``masked`` shown as ``***``
    (both APIs keep a container's variables in a list under ``env``), and the pod runner's code
    (``runner.BUNDLE_ENV``) as its size and digest."""
    if isinstance(obj, dict):
        return {k: [_masked_entry(e, masked) for e in v] if k == "env" and isinstance(v, list) else masked_env(v, masked)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [masked_env(v, masked) for v in obj]
    return obj


def _masked_entry(entry: JSON, masked: frozenset[str]) -> JSON:
    value = entry.get("value") if isinstance(entry, dict) else None
    if isinstance(entry, dict) and entry.get("name") == BUNDLE_ENV and isinstance(value, str):
        return {**entry, "value": shown(value)}
    if isinstance(entry, dict) and isinstance(value, str):
        return {**entry, "value": shown_value(str(entry.get("name")), value, masked)}
    return entry


def render_text(payload: K8sPayload, masked: frozenset[str] = frozenset()) -> str:
    """The multi-document YAML that ``submit`` sends, with a comment header for the reader; the
    values of the env names in ``masked`` shown as ``***``."""
    api = api_of(payload.api)
    head = [f"# ddpjob k8s plan: job {payload.job_id}, {payload.runs or len(payload.manifests)} {api.kind}(s) ({api.api_version})"]
    if payload.namespace is None:
        head.append("# namespace: the kubeconfig context's (set k8s.namespace to choose)")
    head.extend(f"# {n}" for n in payload.notes)
    return "\n".join(head) + "\n---\n" + "---\n".join(to_yaml(masked_env(o, masked)) for o in payload.manifests)
