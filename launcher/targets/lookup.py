"""The target called by name at run time (the service's ``get_target``).

The names and where each target's class is come from the plugins (``launcher.core.plugins``); a
registered target that cannot be loaded is ``TargetUnavailable``, saying which package and why.
"""

from __future__ import annotations

from launcher.core.errors import TargetUnavailable
from launcher.core.plugins import PluginError, load, plugin, registered, target_names
from launcher.targets.chosen import Chosen, chosen


def get_target(name: str) -> Chosen:
    """The target called ``name``, as the service holds it (``launcher.targets.chosen``); raises
    ``TargetUnavailable`` if it cannot be loaded here."""
    return chosen(target_class(name)())


def target_class(name: str) -> type:
    """The ``Target`` class of the target called ``name`` (``TargetUnavailable`` if it cannot be loaded here)."""
    if name not in registered():
        raise TargetUnavailable(f"unknown target {name!r}; choose one of {', '.join(target_names())}")
    try:
        ref = plugin(name).target
        cls = load(ref, f"the {name} target's class {ref}")
    except PluginError as e:
        raise TargetUnavailable(str(e)) from e
    if not isinstance(cls, type) or getattr(cls, "name", None) != name:
        raise TargetUnavailable(f"the {name} target's class {ref} is not a Target whose name is {name!r}")
    return cls
