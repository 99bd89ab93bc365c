"""The two flavours of the k8s target, by ``k8s.api``: everything the target does differently for a
PyTorchJob (``pytorchjob``) and a TrainJob (``trainjob``), in one place, so that ``target`` plans,
submits and reads status with one code path. The objects come from the one loop in ``render``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.targets.k8s.objects import pytorchjob, trainjob
from launcher.targets.k8s.objects.apis import PYTORCHJOB, TRAINJOB, KubeflowApi
from launcher.targets.k8s.objects.render import Builder, Rendered, SpecPath, render
from launcher.targets.k8s.validation.check import SpecFieldOf, check_objects

if TYPE_CHECKING:
    from launcher.core.errors import Issue
    from launcher.core.jsondata import JSONObject
    from launcher.core.states import JobState
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.k8s.validation.crd import CrdInput
    from launcher.targets.k8s.validation.schema import SchemaIssue


@dataclass(frozen=True)
class Flavour:
    """What one API does its own way.

    Attributes:
        spec_issues: what its objects cannot carry or its controller refuses, at the spec's fields.
        build: one run's object (``render.Builder``).
        controller_env: the variables its controller sets after ours (None: none of ddpjob's).
        problems: an object's structural and (with the CRD's schema) strict problems.
        spec_field: an object path -> the spec field behind it.
        field_targets: every spec field ``spec_field`` can give.
        same: problems at paths with the same key are one problem of the spec.
        state, summary: an object's ``status`` -> (state, message), and its child counts in words.
    """

    api: KubeflowApi
    spec_issues: Callable[[JobSpec, str], list[Issue]]
    build: Builder
    controller_env: Callable[[str], bool] | None
    problems: Callable[[JSONObject, JSONObject | None], list[SchemaIssue]]
    spec_field: SpecFieldOf
    field_targets: list[SpecPath]
    same: Callable[[SpecPath], SpecPath]
    state: Callable[[object], tuple[JobState, str]]
    summary: Callable[[object], str]

    def render(self, spec: JobSpec, job_id: str, nccl_defaults: dict[str, str]) -> Rendered:
        return render(spec, job_id, nccl_defaults, self.build, self.controller_env)

    def check(self, loaded: LoadedSpec, objects: list[JSONObject], crd: CrdInput) -> None:
        """Raise ``SpecError`` (every problem, at its spec field) if an object fails a check."""
        check_objects(loaded, objects, self.api.kind, lambda obj: self.problems(obj, crd.schema), self.spec_field,
                      self.same)


def _validate_pytorchjob(obj: JSONObject, schema: JSONObject | None) -> list[SchemaIssue]:
    from launcher.targets.k8s.validation.schema import validate_pytorchjob

    return validate_pytorchjob(obj, schema)


def _validate_trainjob(obj: JSONObject, schema: JSONObject | None) -> list[SchemaIssue]:
    from launcher.targets.k8s.validation.trainjob_rules import validate_trainjob

    return validate_trainjob(obj, schema)


FLAVOURS = {
    PYTORCHJOB.key: Flavour(PYTORCHJOB, pytorchjob.spec_issues, pytorchjob.build, pytorchjob.controller_env,
                            _validate_pytorchjob, pytorchjob.spec_field, pytorchjob.FIELD_TARGETS,
                            pytorchjob.one_template, pytorchjob.condition_state, pytorchjob.replica_summary),
    TRAINJOB.key: Flavour(TRAINJOB, trainjob.spec_issues, trainjob.build, None, _validate_trainjob,
                          trainjob.spec_field, trainjob.FIELD_TARGETS, lambda path: path, trainjob.condition_state,
                          trainjob.jobs_summary),
}


def flavour_of(key: str | None) -> Flavour:
    """The flavour of ``k8s.api`` (or a handle's or payload's ``api``); unknown or missing: PyTorchJob."""
    return FLAVOURS.get(key or PYTORCHJOB.key, FLAVOURS[PYTORCHJOB.key])
