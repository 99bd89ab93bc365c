"""``build.requirements``: the project's declared requirements, installed into a layer of their own.

The generated Dockerfile copies only what the requirements need (the file, the files and folders it
names by a local path, and the files those name) under ``/opt/ddpjob/requirements`` and runs pip
there before the context is copied: the engine's layer cache keys that step on those files, so a
change to the code reuses the installed layer, and a change to the requirements rebuilds it.
A ``pyproject.toml`` gives its ``[project] dependencies`` instead, named in the RUN step itself.

Nothing reaches a shell: COPY, WORKDIR and RUN are in their JSON (exec) form, every path is a plain
context path (``CONTEXT_PATH_RE``) and every dependency a JSON string. pip runs as root (the base's
site-packages are root's, e.g. ddpjob's image's /opt/venv); the base's user is set back after it
(``USER_ARG``, given by the engine from the base image's own configuration).
"""

from __future__ import annotations

import importlib
import json
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from launcher.spec.build import CONTEXT_PATH_RE

PREFIX = "/opt/ddpjob/requirements"
USER_ARG = "DDPJOB_BASE_USER"
MAX_FILES = 50  # requirement files followed through -r / -c
_FILE_OPTIONS = ("-r", "--requirement", "-c", "--constraint")
_PATH_OPTIONS = ("-f", "--find-links", "-e", "--editable")


@dataclass
class Requirements:
    """What the install step needs: ``inputs`` (context paths copied for it, sorted) or ``deps``
    (a pyproject's dependencies), and the problems found (``problems``: messages)."""

    rel: str
    inputs: list[str] = field(default_factory=list)
    deps: list[str] | None = None
    problems: list[str] = field(default_factory=list)

    def dockerfile_lines(self) -> str:
        """The install step of the generated Dockerfile (after FROM, before the context's COPY)."""
        out = [f"ARG {USER_ARG}=root", "USER root"]
        pip = ["python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
        if self.deps is not None:
            out.append(f"RUN {json.dumps([*pip, *self.deps])}")
        else:
            out += [f"COPY {json.dumps([rel, f'{PREFIX}/{rel}'])}" for rel in self.inputs]
            folder = posixpath.dirname(self.rel)
            out.append(f"WORKDIR {PREFIX}{'/' + folder if folder else ''}")
            out.append(f"RUN {json.dumps([*pip, '-r', posixpath.basename(self.rel)])}")
        out.append(f"USER ${{{USER_ARG}}}")
        return "\n".join(out) + "\n"


def read(root: Path, rel: str, in_context: set[str]) -> Requirements:
    """The requirements ``rel`` names in the context ``root``; ``in_context``: the context's paths
    that go into the image (a path left out cannot be copied for the install either)."""
    req = Requirements(rel)
    if posixpath.basename(rel) == "pyproject.toml":
        req.deps = _pyproject_deps(root / rel, req.problems)
        return req
    todo, seen = [rel], set[str]()
    while todo and len(seen) < MAX_FILES:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current not in in_context:
            why = "is not in the context" if not (root / current).exists() else "is left out of the context"
            req.problems.append(f"{current} {why} (named by build.requirements{'' if current == rel else ' through ' + rel})")
            continue
        try:
            text = (root / current).read_text()
        except (OSError, UnicodeDecodeError) as e:
            req.problems.append(f"{current} cannot be read: {e}")
            continue
        for kind, path in _local_paths(text):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(current), path))
            if target.startswith("../") or target == ".." or not CONTEXT_PATH_RE.match(target):
                req.problems.append(f"{current} names {path!r}, which is not a plain path inside the context "
                                    "(letters, digits, '.', '_', '-', '/')")
            elif kind == "file":
                todo.append(target)
            elif target not in in_context:
                req.problems.append(f"{current} names {path}, which is not in the context (or is left out of it)")
            else:
                req.inputs.append(target)
    req.inputs = sorted(set(req.inputs) | seen)
    return req


def _local_paths(text: str) -> list[tuple[str, str]]:
    """("file", path) for each requirement file a line includes (-r, -c), ("path", path) for each
    local file or folder it installs from (-f, -e, ./x.whl); URLs, names and absolute paths are pip's."""
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        opt, _, value = line.partition("=") if line.startswith("--") and "=" in line.split()[0] else line.partition(" ")
        value = value.strip()
        if opt in _FILE_OPTIONS and value and "://" not in value:
            out.append(("file", value))
        elif opt in _PATH_OPTIONS and value and "://" not in value and not value.startswith("/"):
            out.append(("path", value))
        elif line.startswith(("./", "../")):
            out.append(("path", line.split()[0].split("[", 1)[0]))
    return out


def _pyproject_deps(path: Path, problems: list[str]) -> list[str] | None:
    try:
        tomllib = importlib.import_module("tomllib")
    except ImportError:  # Python 3.10
        problems.append("reading pyproject.toml needs Python 3.11 or later; name a requirements file instead")
        return None
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError) as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        problems.append(f"{path} cannot be read: {e}")
        return None
    deps = (data.get("project") or {}).get("dependencies")
    if not isinstance(deps, list) or not deps or not all(isinstance(d, str) and d.strip() for d in deps):
        problems.append(f"{path} has no [project] dependencies (a list of requirement strings) to install")
        return None
    bad = [d for d in deps if any(ord(c) < 32 for c in d)]
    if bad:
        problems.append(f"{path}: a dependency holds a control character: {bad[0]!r}")
        return None
    return [d.strip() for d in deps]
