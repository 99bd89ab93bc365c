"""Defaults from files, and env values from the command line.

Precedence, highest first: flags (``--set``, ``--env``, ``--env-file``, ``--nodes``, ``--target``)
> the spec > the project file (``.ddpjob.yaml``, found upward from the working directory) > the user
config (``$DDPJOB_CONFIG``, else ``$XDG_CONFIG_HOME/ddpjob/config.yaml``, else
``~/.config/ddpjob/config.yaml``) > ddpjob's built-in defaults.

Both files hold spec fields (any of them, e.g. ``image``, ``slurm: {partition, account, time}``,
``k8s: {context, namespace, queue}``, ``env``) and ``target``. A file's value fills a field the
spec leaves out; mappings merge key by key, anything else (a list, a number) is taken whole. A
value from a file that the spec refuses is reported at that file's line. ``DDPJOB_CONFIG=none``
reads no user config (and no project file), for scripts and tests that want the built-in defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.core.errors import Issue, SpecError
from launcher.spec import yamlread
from launcher.spec.secrets import printable

USER_CONFIG_ENV = "DDPJOB_CONFIG"
PROJECT_FILE = ".ddpjob.yaml"
USER_KIND, PROJECT_KIND = "user config", "project file"

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Layer:
    """One defaults file as read: its kind (``user config`` or ``project file``), path, data and
    where each field is (line, column)."""

    kind: str
    file: str
    data: dict[str, object]
    locations: dict[FieldPath, tuple[int, int]]

    def source(self, path: FieldPath) -> str:
        """How a value from this file is named in messages: ``project file /x/.ddpjob.yaml:3``."""
        line = self.locations.get(path, self.locations.get((), (1, 1)))[0]
        return f"{self.kind} {self.file}:{line}"


def user_config_path() -> str | None:
    """The user config's path (it may not exist), or None when ``DDPJOB_CONFIG=none``."""
    named = os.environ.get(USER_CONFIG_ENV)
    if named is not None and named.strip():
        return None if named.strip().lower() == "none" else os.path.expanduser(named)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ddpjob", "config.yaml")


def project_file(cwd: str | None = None) -> str | None:
    """The nearest ``.ddpjob.yaml`` in ``cwd`` or a folder above it, or None."""
    here = Path(cwd or os.getcwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return str(candidate)
    return None


def layers(cwd: str | None = None) -> list[Layer]:
    """The defaults files that exist, lowest precedence first (user config, then project file).
    Raises ``SpecError`` (at the file's line) for one that cannot be read or is not a mapping."""
    user = user_config_path()
    if user is None:  # DDPJOB_CONFIG=none: the built-in defaults alone
        return []
    if not os.path.exists(user) and os.environ.get(USER_CONFIG_ENV, "").strip():
        raise SpecError(user, [Issue((), f"no such file (named by {USER_CONFIG_ENV})",
                                     hint=f"create it, or unset {USER_CONFIG_ENV} (none: read no defaults file)")])
    found = [(USER_KIND, user)] if os.path.exists(user) else []
    project = project_file(cwd)
    if project is not None and (not found or not os.path.samefile(project, user)):
        found.append((PROJECT_KIND, project))
    return [_read(kind, path) for kind, path in found]


def _read(kind: str, path: str) -> Layer:
    text = yamlread.read_spec_text(path)
    data, locations, issues = yamlread.parse(text, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(path, [Issue((), f"a {kind} is a mapping of spec fields and target, not a {type(data).__name__}",
                                     hint="e.g. target: slurm, then slurm: {partition: gpu}")], locations)
    target = data.get("target")
    if target is not None:
        from launcher.core.plugins import target_names

        if target not in target_names():
            issues.append(Issue(("target",), f"{target!r} is not a target", hint=f"one of {', '.join(target_names())}"))
    if issues:
        raise SpecError(path, issues, locations)
    return Layer(kind, path, data, locations)


def default_target(found: list[Layer]) -> tuple[str, str] | None:
    """(target, where it was set) from the highest file that names one, or None."""
    for layer in reversed(found):
        if isinstance(target := layer.data.get("target"), str):
            return target, layer.source(("target",))
    return None


def fill(data: dict[str, object], found: list[Layer]) -> dict[FieldPath, str]:
    """Put into ``data`` each file's value of a field that ``data`` leaves out, the higher file
    first; returns where each value put in came from (field path -> source)."""
    sources: dict[FieldPath, str] = {}
    for layer in reversed(found):
        for path, value in leaves({k: v for k, v in layer.data.items() if k != "target"}, ()):
            if _put_if_absent(data, path, value):
                sources[path] = layer.source(path)
    return sources


def drop_idle_notify(data: dict[str, object], filled: dict[FieldPath, str]) -> None:
    """Leave out a ``notify`` section that only a defaults file gave and that says nothing to do:
    ``notify: {when: [failed]}`` in a user config says which endings notify a spec that asks to be
    told (``--notify``, ``notify.url`` in the spec), and asks nothing of the specs that do not."""
    notify = data.get("notify")
    if (isinstance(notify, dict) and notify and notify.get("command") is None and notify.get("url") is None
            and all(("notify", str(k)) in filled for k in notify)):
        del data["notify"]


def leaves(data: Mapping[str, object], prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], object]]:
    out: list[tuple[tuple[str, ...], object]] = []
    for key, value in data.items():
        path = (*prefix, str(key))
        if isinstance(value, dict) and value:
            out.extend(leaves(value, path))
        else:
            out.append((path, value))
    return out


def _put_if_absent(data: dict[str, object], path: tuple[str, ...], value: object) -> bool:
    cur = data
    for part in path[:-1]:
        nxt = cur.setdefault(part, {})
        if not isinstance(nxt, dict):  # the spec gives this field another shape: the spec wins
            return False
        cur = nxt
    if path[-1] in cur:
        return False
    cur[path[-1]] = value
    return True


def read_env_file(path: str) -> list[tuple[str, str, str]]:
    """``(NAME, value, source)`` for each ``NAME=value`` line of a dotenv file: ``#`` comments and
    blank lines skipped, an optional ``export``, values in single quotes taken as written, in double
    quotes with ``\\n``, ``\\"`` and ``\\\\`` escapes. Raises ``SpecError`` at the bad line; a value
    is never shown in a message."""
    try:
        text = yamlread.read_spec_text(path)
    except SpecError as e:  # not found, not a file, too large, not UTF-8: in a dotenv file's words
        raise SpecError(None, [Issue(("env",), e.issues[0].message, "give a dotenv file: NAME=value lines",
                                     source=f"--env-file {printable(path)}")]) from e
    out: list[tuple[str, str, str]] = []
    issues: list[Issue] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        where = f"--env-file {path}:{number}"
        if not sep or not name.isidentifier() or not name.isascii():
            issues.append(Issue(("env",), "expected NAME=value (a variable name of letters, digits and _)",
                                hint="e.g. WANDB_PROJECT=demo; # starts a comment", source=where))
            continue
        parsed = _dotenv_value(value.strip())
        if parsed is None:
            issues.append(Issue(("env", name), "a quoted value is not closed on its line",
                                hint="close the quote, or leave the value unquoted", source=where))
            continue
        out.append((name, parsed, where))
    if issues:
        raise SpecError(None, issues)
    return out


def _dotenv_value(value: str) -> str | None:
    if value[:1] in ("'", '"'):
        quote = value[0]
        end = value.find(quote, 1)
        while quote == '"' and end > 0 and value[end - 1] == "\\" and not value[:end].endswith("\\\\"):
            end = value.find(quote, end + 1)
        if end < 0:
            return None
        inner = value[1:end]
        if quote == '"':
            inner = inner.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        return inner
    comment = value.find(" #")
    return (value[:comment] if comment >= 0 else value).rstrip()


def env_pair(text: str) -> tuple[str, str, str]:
    """``--env NAME=value`` as ``(NAME, value, source)``; the source names the variable only."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier() or not name.isascii():
        raise SpecError(None, [Issue(("env",), "expected --env NAME=value (a variable name of letters, digits and _)",
                                     hint="e.g. --env WANDB_PROJECT=demo", source=f"--env {printable(name[:40])}")])
    return name, value, f"--env {name}"


def notify_values(command: str | None, url: str | None) -> list[tuple[tuple[str, ...], object, str]]:
    """``--notify CMD`` (split like a shell line: it never runs in one) and ``--notify-url URL`` as
    ``(field path, value, source)``; the URL is named in messages without its path."""
    import shlex

    from launcher.spec.secrets import shown_url

    out: list[tuple[tuple[str, ...], object, str]] = []
    if command is not None:
        try:
            words = shlex.split(command)
        except ValueError as e:
            raise SpecError(None, [Issue(("notify", "command"), f"cannot split the command: {e}",
                                         hint="close the quote", source="--notify")]) from e
        out.append((("notify", "command"), words, "--notify"))
    if url is not None:
        out.append((("notify", "url"), url, f"--notify-url {printable(shown_url(url))}"))
    return out
