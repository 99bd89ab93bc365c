"""Targets: where a job runs. The one place where target names are declared.

Each target is a package ``launcher/targets/<name>/`` holding its spec section (``options.py``,
a pydantic model that becomes the spec's ``<name>:`` field), its plan/render, submit, status and
logs (``target.py``). This module holds only strings, so that importing it (the CLI does, for
``--target``) costs nothing; a target's modules are imported when that target is used
(``lookup.get_target``). The spec imports this module, so it refers to nothing of ``base`` (not
even by type): no import circle runs through it.

Beside the names: the target interface and its plan, context and handle (``base``), what ``status``
returns (``jobstatus``), a target looked up by name (``lookup``) and held by the service with a recorded
job (``chosen``); the pieces the targets share (``shared``) and one package per target (``local``,
``slurm``, ``k8s``).

Adding a target: write the package, then add one line to ``TARGETS`` below (ARCHITECTURE.md, "Adding a
target", lists what the tests ask of it).
"""

from __future__ import annotations

import importlib
from collections import namedtuple
from typing import Any


class TargetEntry(namedtuple("TargetEntry", "target options summary")):
    """How to find one target: its Target class (``target``, "module:Class"), its spec section's
    options model (``options``, "module:Model", the spec's ``<name>:`` section) and one line for
    --help and the schema (``summary``)."""

    __slots__ = ()


TARGETS: dict[str, TargetEntry] = {
    "local": TargetEntry("launcher.targets.local.target:LocalTarget", "launcher.targets.local.options:LocalOptions",
                         "Options for --target local (torchrun agents on this machine)."),
    "slurm": TargetEntry("launcher.targets.slurm.target:SlurmTarget", "launcher.targets.slurm.options:SlurmOptions",
                         "Options for --target slurm."),
    "k8s": TargetEntry("launcher.targets.k8s.target:KubernetesTarget", "launcher.targets.k8s.options:K8sOptions",
                       "Options for --target k8s."),
}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)


def _load(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def options_model(name: str) -> Any:
    """The pydantic model of the spec section of target ``name`` (imports only that module)."""
    return _load(TARGETS[name].options)

