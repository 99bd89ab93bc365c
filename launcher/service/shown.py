"""The plan people see: secret values masked and ``env_from_host`` names listed, and the checks of
``env_from_host`` against the target and the submitting shell (``launcher.spec.secrets`` decides
what is secret)."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from launcher.spec.secrets import host_env_note, secret_names

if TYPE_CHECKING:
    from launcher.core.errors import Issue
    from launcher.spec.load import LoadedSpec
    from launcher.targets.base import Plan
    from launcher.targets.chosen import Chosen


def shown_plan(loaded: LoadedSpec, plan: Plan[object]) -> Plan[object]:
    """``plan`` as people see it: the values of secret env names masked, ``env_from_host`` names listed.

    Nothing is planned again: ``Plan.render`` renders the same payload (which keeps the real values,
    as submitted) with those names masked, so the text keeps the real layout and quoting.
    """
    spec = loaded.spec
    notes = host_env_note(list(spec.env_from_host)) if spec.env_from_host else ""
    return dataclasses.replace(plan, masked=secret_names(spec.env), notes=notes + interpreter_note(spec.command))


def interpreter_note(command: list[str]) -> str:
    """A command that names a Python of its own (``python3.11 train.py``, ``/usr/bin/python3``): torchrun
    starts a Python program with the interpreter torchrun runs in, so that name is not used. Said, not
    silently done ("" for ``python`` and ``python3``, which mean just that)."""
    first = command[0] if command else ""
    name = os.path.basename(first)
    if not name.startswith("python") or first in ("python", "python3"):
        return ""
    return (f"# command: {first} is not run as such: torchrun starts a Python program with the Python that runs "
            "torchrun on the nodes (this machine's for local, the nodes' or the image's elsewhere); to use another "
            "interpreter, install ddpjob's [train] extra for it and run ddpjob with it, or use the image that has it\n")


def host_env_issues(target: Chosen, loaded: LoadedSpec, *, submitting: bool) -> list[Issue]:
    """Why ``env_from_host`` cannot be honoured: a target that would have to store the values, or
    (at submit) a name the submitting shell does not set. Returns spec ``Issue``s."""
    from launcher.core.errors import Issue
    from launcher.core.plugins import plugin

    names = list(loaded.spec.env_from_host)
    if not names:
        return []
    if not target.passes_host_env:
        refs = [f"{target.name}.{f}" for f in plugin(target.name).options.model_fields if f.startswith("env_")]
        return [Issue(("env_from_host",), f"the {target.name} target cannot take values from the submitting shell "
                      "without storing them", hint="keep the value in the scheduler and refer to it"
                      + (f": {' or '.join(refs)}" if refs else ""))]
    missing = [n for n in names if n not in os.environ] if submitting else []
    if missing:
        return [Issue(("env_from_host",), f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set in "
                      "this shell", hint=f"export {missing[0]}=... before submitting")]
    return []
