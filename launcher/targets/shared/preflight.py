"""Checks made on the submitting machine before a job is submitted (``--no-preflight`` skips them).

A script that does not exist fails only once torchrun has started every node (about 16 s and a
traceback per node later); found here, it is a spec error at submit time with the path it looked
for. Only what can be known from here is checked: ``python X.py`` (the file, from the job's
working directory) and ``python -m pkg.mod`` (``pkg`` in the working directory or importable by
the interpreter that runs the job), after the working directory itself (missing, or a file).
Paths with placeholders are left to the job.
"""

from __future__ import annotations

import importlib.util
import os

from launcher.core.errors import Issue
from launcher.spec.sweep import placeholders
from launcher.targets.shared.launch import torchrun_program


def missing_program(command: list[str], workdir: str, *, check_modules: bool = True) -> list[Issue]:
    """Issues for a working directory that is not one, or else for a script or module of
    ``command`` that cannot be found from ``workdir``."""
    if not os.path.isdir(workdir) and not placeholders(workdir):
        what = "is a file, not a directory" if os.path.exists(workdir) else "does not exist"
        return [Issue(("workdir",), f"the working directory {workdir} {what}",
                      hint="create it or fix workdir: (relative paths start at the spec file's folder), "
                      "or pass --no-preflight if the job's machines have it")]
    program = torchrun_program(command, "python")
    if not program or program[0] == "--no-python":
        return []
    offset = len(command) - len(program)  # index in ``command`` of the program's first word
    if program[0] == "-m":
        if not check_modules or len(program) < 2 or placeholders(program[1]):
            return []
        top = program[1].split(".")[0]
        if os.path.isfile(os.path.join(workdir, f"{top}.py")) or os.path.isdir(os.path.join(workdir, top)):
            return []
        if importlib.util.find_spec(top) is not None:  # top-level only: never imports the package
            return []
        return [Issue(("command", offset + 1), f"module {program[1]!r} not found: no {top}.py or {top}/ in "
                      f"{workdir} and {top!r} is not installed for this Python",
                      hint="check the module name and workdir:, or pass --no-preflight if the job installs it")]
    script = program[0]
    if placeholders(script):
        return []
    path = script if os.path.isabs(script) else os.path.join(workdir, script)
    if os.path.isfile(path):
        return []
    return [Issue(("command", offset), f"script {path} does not exist",
                  hint="check the path (relative paths start at workdir:, default: where you submit from), "
                  "or pass --no-preflight if the job creates it")]
