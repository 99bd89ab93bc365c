"""Targets as plugins: every target, the three built-in ones included, is found through the entry-point
group ``ddpjob.targets`` of the installed distributions.

An entry point names a ``TargetPlugin`` (``name = "module:OBJECT"``), which says where the target's class
is, its spec section's options model (the spec's ``<name>:`` section), one line for ``--help`` and the
schema, and the Markdown page ``ddpjob docs <name>`` prints. ddpjob's own ``pyproject.toml`` registers
``local``, ``slurm`` and ``k8s`` this way; another package registers its own the same way, and once it
is installed ``--target <its name>`` works, its section is part of every spec and its page is in
``ddpjob docs``, with no file of ddpjob changed (docs/targets.md, "A target of your own").

Finding the names costs no import: the entry points are read from each distribution's
``entry_points.txt`` on ``sys.path``, as ``importlib.metadata`` reads them (first distribution of a
name wins), without importing ``importlib.metadata`` itself (~20 ms, which the CLI does not pay; a test
holds that both find the same). A plugin's module is imported when its target is first needed (a spec
is validated: every section; a job is submitted or asked about: that target's class). Run from a
source tree that is not installed (no ``ddpjob`` distribution on the path), the three built-in targets
are found by their modules' names instead.

Nothing of ddpjob is imported here: the spec (which builds its sections from these plugins) and the
targets (whose sections are spec models) both depend on this module, not on each other.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pydantic import BaseModel

GROUP = "ddpjob.targets"
# The built-in targets: pyproject.toml's [project.entry-points."ddpjob.targets"] names these same objects.
BUILTIN: dict[str, str] = {
    "local": "launcher.targets.local.options:TARGET",
    "slurm": "launcher.targets.slurm.options:TARGET",
    "k8s": "launcher.targets.k8s.options:TARGET",
}
DISTRIBUTION = "ddpjob"


class TargetPlugin(NamedTuple):
    """What a target brings (the object its ``ddpjob.targets`` entry point names).

    Attributes:
        target: its ``Target`` class (``launcher.targets.base``), as ``"module:Class"``: imported only
            when a job is planned, submitted or asked about on that target.
        options: its spec section, a pydantic model whose every field has a default (the spec's
            ``<name>:`` section, validated in every spec: a typo in it is found on any target).
        summary: one line, for ``--help``, the schema and ``ddpjob docs``.
        docs: its Markdown page (a path relative to the folder of the module that holds this object,
            or absolute), printed by ``ddpjob docs <name>``; "" for none.
    """

    target: str
    options: type[BaseModel]
    summary: str
    docs: str = ""


class Registered(NamedTuple):
    """A target's entry point as found: its name, the object it names, the distribution declaring it."""

    name: str
    ref: str
    distribution: str


def _dist_name(folder: str) -> str:
    """``My_Target-1.0.dist-info`` -> ``my-target`` (the normalized name: one distribution of a name counts)."""
    stem = folder.removesuffix(".dist-info").removesuffix(".egg-info")
    return stem.split("-", 1)[0].lower().replace("_", "-").replace(".", "-")


def _entries(text: str) -> list[tuple[str, str]]:
    """``(name, value)`` of the ``[ddpjob.targets]`` section of an ``entry_points.txt``."""
    found: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            inside = line.strip("[] ") == GROUP
        elif inside and "=" in line:
            name, _, value = line.partition("=")
            found.append((name.strip(), value.strip()))
    return found


def scan(path: list[str] | None = None) -> list[Registered]:
    """Every ``ddpjob.targets`` entry point of the distributions on ``path`` (``sys.path``), in path order;
    of two distributions with the same name only the first counts, as for ``importlib.metadata``."""
    seen: set[str] = set()
    found: list[Registered] = []
    for entry in sys.path if path is None else path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for folder in names:
            if not folder.endswith((".dist-info", ".egg-info")):
                continue
            dist = _dist_name(folder)
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", folder, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            if GROUP in text:
                found += [Registered(name, ref, dist) for name, ref in _entries(text)]
    return found


@functools.cache
def registered() -> dict[str, Registered]:
    """Each target's name and where its plugin is: ddpjob's own first, then the others in the order found.
    A name registered twice keeps the first (a plugin cannot replace a built-in target)."""
    found = scan()
    targets: dict[str, Registered] = {}
    if not any(r.distribution == DISTRIBUTION for r in found):  # a source tree run without being installed
        targets = {name: Registered(name, ref, DISTRIBUTION) for name, ref in BUILTIN.items()}
    order = list(BUILTIN)  # entry_points.txt lists a distribution's names sorted: ddpjob's keep this order
    for reg in sorted(found, key=lambda r: (r.distribution != DISTRIBUTION,
                                            order.index(r.name) if r.name in order else len(order))):
        targets.setdefault(reg.name, reg)
    return targets


def target_names() -> tuple[str, ...]:
    """Every target's name (``--target``'s choices), without importing any of them."""
    return tuple(registered())


class PluginError(Exception):
    """A registered target that cannot be loaded: says which, from which distribution, and why."""


def load(ref: str, where: str) -> object:
    """The object ``ref`` (``"module:attr"``) names; ``PluginError`` saying ``where`` it was named and why
    when its module cannot be imported or has no such name."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name.strip())
    except ImportError as e:
        raise PluginError(f"{where} cannot be imported: {e}") from e
    if not attr.strip() or not hasattr(module, attr.strip()):
        raise PluginError(f"{where} names {ref!r}, which its module does not hold")
    value: object = getattr(module, attr.strip())
    return value


@functools.cache
def plugin(name: str) -> TargetPlugin:
    """The ``TargetPlugin`` of target ``name`` (imports its module); ``KeyError`` for a name not
    registered, ``PluginError`` for one that cannot be loaded."""
    reg = registered()[name]
    value = load(reg.ref, f"the {name!r} target (entry point {reg.ref!r} of the {reg.distribution} distribution, "
                          f"group {GROUP})")
    if not isinstance(value, TargetPlugin):
        raise PluginError(f"the {name!r} target's entry point {reg.ref!r} ({reg.distribution}) names "
                          f"{type(value).__name__}, not a launcher.core.plugins.TargetPlugin")
    return value


def docs_page(name: str) -> str | None:
    """The path of target ``name``'s page (``TargetPlugin.docs``), or None."""
    found = plugin(name)
    if not found.docs:
        return None
    module = sys.modules[registered()[name].ref.partition(":")[0].strip()]
    base = os.path.dirname(module.__file__ or "")
    return os.path.join(base, found.docs)
