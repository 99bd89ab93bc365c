"""The target called by name at run time (the service's ``get_target``).

It lives beside the names, not in ``launcher/targets/__init__.py``: the spec imports that module
(for the names and each target's section), so it refers to nothing of ``targets.base``, not even
by type, and no import circle runs through it.
"""

from __future__ import annotations

import importlib

from launcher.core.errors import TargetUnavailable
from launcher.targets import TARGET_NAMES, TARGETS
from launcher.targets.chosen import Chosen, chosen


def get_target(name: str) -> Chosen:
    """The target called ``name``, as the service holds it (``launcher.targets.chosen``); raises
    ``TargetUnavailable`` if it cannot be loaded here."""
    return chosen(target_class(name)())


def target_class(name: str) -> type:
    """The ``Target`` class of the target called ``name`` (``TargetUnavailable`` if it cannot be loaded here)."""
    entry = TARGETS.get(name)
    if entry is None:
        raise TargetUnavailable(f"unknown target {name!r}; choose one of {', '.join(TARGET_NAMES)}")
    module_name, _, attr = entry.target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise TargetUnavailable(f"the {name} target is not part of this installation") from e
        raise
    if not isinstance(cls, type):
        raise TypeError(f"{entry.target} is not a class")
    return cls
