"""Targets: where a job runs. Each module is imported only when its target is used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from launcher.errors import TargetUnavailable

if TYPE_CHECKING:
    from launcher.targets.base import Target

TARGETS = ("local", "slurm", "k8s")
_MODULES = {"local": ("launcher.targets.local", "LocalTarget"),
            "slurm": ("launcher.targets.slurm", "SlurmTarget"),
            "k8s": ("launcher.targets.k8s", "KubernetesTarget")}


def get_target(name: str) -> Target:
    """The target called ``name``; raises ``TargetUnavailable`` if it cannot be loaded here."""
    if name not in _MODULES:
        raise TargetUnavailable(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    module_name, cls_name = _MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise TargetUnavailable(f"the {name} target is not part of this installation") from e
        raise
    return getattr(module, cls_name)()
