"""Loading a job's spec for the service: a spec file, or a spec made of a bare command (named
after the script it runs), with the defaults files and the command line's values and overrides."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.core.errors import UsageError

if TYPE_CHECKING:
    from launcher.spec.load import LoadedSpec


def load(spec_path: str | None, *, command: list[str] | None = None, overrides: list[str] = (),  # type: ignore[assignment]
         text: str | None = None, values: list[tuple[tuple[str, ...], object, str]] = ()) -> LoadedSpec:  # type: ignore[assignment]
    """A spec file, or a spec made of a bare ``command`` (``ddpjob submit -- python train.py``).

    The project file and user config fill what the spec leaves out (``spec/defaults.py``); ``values``
    (``--env-file``, ``--env``, ``--notify``) and the overrides (``KEY=VALUE``) apply over it before validation.
    Raises ``SpecError`` listing every problem. ``text``: the spec's text, read already (from
    standard input); ``spec_path`` then names it.
    """
    from launcher.spec.defaults import layers
    from launcher.spec.load import load_spec
    from launcher.spec.model import sanitize_name

    if spec_path is not None:
        return load_spec(spec_path, text=text, overrides=list(overrides), defaults=layers(), values=list(values))
    if not command:
        raise UsageError("give a spec file (ddpjob init writes quickstart.yaml) or a command after -- "
                         "(ddpjob submit --nodes 2 -- python train.py)")
    words = [a if isinstance(a, str) else "-" for a in command]  # the API may pass anything: validation says what
    base = {"name": sanitize_name(os.path.splitext(os.path.basename(_named_after(words)))[0]), "command": list(command)}
    return load_spec(None, base=base, overrides=list(overrides), defaults=layers(), values=list(values))


# Python's own options that take a value (``python -X dev train.py``: the script is train.py).
_PYTHON_VALUED = {"-X", "-W", "--check-hash-based-pycs"}


def _named_after(command: list[str]) -> str:
    """The word a command-only job is named after: the script Python runs (``-m``: the module), the
    program itself when it is a script (``./multinode.py 5 1``), else the first word after the
    program that is not an option (``bash run.sh``)."""
    program = os.path.basename(command[0])
    if program.startswith("python"):
        args = iter(command[1:])
        for arg in args:
            if arg in _PYTHON_VALUED:
                next(args, None)
            elif arg == "-m":
                return next(args, program)
            elif arg == "-c" or arg == "-":
                return program
            elif not arg.startswith("-"):
                return arg
        return program
    if "/" in command[0] or "." in program:
        return command[0]
    return next((a for a in command[1:] if not a.startswith("-")), command[0])
