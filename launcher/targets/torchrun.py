"""How a spec's command becomes torchrun's arguments; shared by every target.

Two torchrun behaviours shape this:
- torchrun runs scripts and ``-m`` modules with its own interpreter, so a leading ``python`` is
  dropped; any other program runs as it is with ``--no-python``.
- torchrun passes every worker argument through ``string.Template.safe_substitute`` (its
  ``${local_rank}`` macro): ``$$`` would reach the program as ``$`` and ``$local_rank`` as a
  number. Doubling every ``$`` undoes that exactly, so user arguments arrive as written. With
  ``--no-python`` the program name itself is not substituted, so it is left alone.
"""

from __future__ import annotations

import os

_PYTHONS = ("python", "python3")


def torchrun_program(command: list[str], python: str) -> list[str]:
    """``script args``, ``-m module args`` or ``--no-python prog args``, before escaping."""
    first = os.path.basename(command[0])
    is_python = first in _PYTHONS or first.startswith("python3.")
    if is_python and len(command) > 1 and (command[1] == "-m" or not command[1].startswith("-")):
        return command[1:]
    if is_python:
        return ["--no-python", python, *command[1:]]
    return ["--no-python", *command]


def torchrun_escape(program: list[str]) -> list[str]:
    """Protect the program's arguments from torchrun's ``$`` macros (see the module docstring)."""
    keep = {1} if program and program[0] == "--no-python" else set()
    return [a if i in keep else a.replace("$", "$$") for i, a in enumerate(program)]


def worker_command(command: list[str], python: str) -> list[str]:
    """Everything after torchrun's own options, so that the workers receive ``command`` literally."""
    return torchrun_escape(torchrun_program(command, python))
