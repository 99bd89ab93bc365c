"""Load a job spec from YAML with every error mapped back to its file, line and field.

``load_spec`` reads the file, applies command-line overrides (``--set a.b=v``, ``--nodes`` ...),
validates with pydantic and raises one ``SpecError`` listing **all** problems, each with
``FILE:LINE:COL: field.path: message`` and a hint (the nearest key for a typo).
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from launcher.core.errors import Issue, SpecError
from launcher.core.fields import control_problem
from launcher.core.interrupts import interrupt_after
from launcher.core.quantity import shorten
from launcher.spec import yamlread as specyaml
from launcher.spec.defaults import Layer, default_target, drop_idle_notify, fill
from launcher.spec.model import JobSpec, sanitize_name, spec_model
from launcher.spec.recovery import recovery_issues
from launcher.spec.secrets import is_secret, mask_override, printable
from launcher.spec.size import size_issues
from launcher.spec.sweep import check_placeholders

if typing.TYPE_CHECKING:
    from pydantic_core import ErrorDetails


@dataclass
class LoadedSpec:
    """A validated spec plus where it came from (for errors found later, e.g. by a target's checks)."""

    spec: JobSpec
    file: str | None
    locations: dict[tuple[str | int, ...], tuple[int, int]] = field(default_factory=dict)
    override_sources: dict[tuple[str | int, ...], str] = field(default_factory=dict)
    default_target: tuple[str, str] | None = None  # (target, where): from the project file or user config
    # A spec not read from a file of its own (a rerun): where it came from, as the registry records
    # it (``launcher.service.origin``); None: from ``file`` and the overrides.
    origin: dict[str, object] | None = None
    # The ``--env-file`` files given (absolute paths): a build leaves them out of the image.
    env_files: tuple[str, ...] = ()

    def chosen_target(self, flag: str | None) -> str:
        """``flag`` (``--target``), else the project file's or user config's target, else local."""
        return flag or (self.default_target[0] if self.default_target else "local")

    def error(self, issues: list[Issue]) -> SpecError:
        """A ``SpecError`` for problems found after loading, located in the same file."""
        located = [_with_source(i, self.override_sources, self.locations) for i in issues]
        return SpecError(self.file, located, self.locations)


# The command line's own flags for a field: an override ``--nodes=3`` is --nodes as typed (messages
# name it so, not as a --set the user never wrote), and sets ``nodes``.
FLAG_FIELDS = {"--nodes": "nodes", "--procs-per-node": "procs_per_node", "--name": "name"}


def override_source(text: str) -> str:
    """How a ``--set`` (or a field's own flag) is named in messages: control characters escaped, secret
    values masked, a long value cut in the middle (the message about it says what is wrong with it)."""
    key, sep, raw = text.partition("=")
    if sep and key in FLAG_FIELDS:
        return f"{key} {shorten(printable(raw), keep=80)}"
    return f"--set {shorten(printable(mask_override(text)), keep=80)}"


def parse_override(text: str) -> tuple[tuple[str, ...], object]:
    """``a.b=value`` -> (("a", "b"), value parsed as a YAML scalar/flow value, under the file's bounds);
    ``--nodes=3`` (``FLAG_FIELDS``) -> (("nodes",), 3)."""
    key, sep, raw = text.partition("=")
    key = FLAG_FIELDS.get(key, key)
    parts = tuple(p.strip() for p in key.split("."))
    source = override_source(text)
    if not sep or not all(parts):
        raise SpecError(None, [Issue((), "expected KEY=VALUE, e.g. --set resources.cpus=4", source=source)])
    problem = control_problem(key, "the key") or control_problem(raw, "the value")
    if len(parts) > specyaml.MAX_DEPTH:
        problem = f"more than {specyaml.MAX_DEPTH} levels of keys"
    if problem:
        raise SpecError(None, [Issue(parts, problem, hint="a spec file refuses the same; pass a file's path instead",
                                     source=source)])
    value = specyaml.parse_value(raw, source, parts) if raw.strip() else ""
    return parts, value


def _apply(data: dict[str, object], parts: tuple[str, ...], value: object, source: str) -> Issue | None:
    cur = data
    for i, part in enumerate(parts[:-1]):
        nxt = cur.get(part)
        if nxt is None:
            nxt = cur[part] = {}
        if not isinstance(nxt, dict):
            return Issue(parts[: i + 1], f"cannot set {'.'.join(parts)}: {part} is not a mapping", source=source)
        cur = nxt
    cur[parts[-1]] = value
    return None


def _with_source(issue: Issue, sources: dict[tuple[str | int, ...], str],
                 locations: dict[tuple[str | int, ...], tuple[int, int]] | None = None) -> Issue:
    """The issue, named after the ``--set`` that caused it: one that set its field or a field under
    it, or one that made the mapping it is about (a field the file does not have, which would
    otherwise be shown at the file's first line)."""
    if issue.source:
        return issue
    for prefix, src in sources.items():
        if tuple(issue.path[: len(prefix)]) == prefix:
            return Issue(issue.path, issue.message, issue.hint, src)
    if locations is not None:
        in_file = next(cut for cut in range(len(issue.path), -1, -1) if cut == 0 or tuple(issue.path[:cut]) in locations)
        best = max(sources, key=lambda p: _common(p, issue.path), default=None)
        if best is not None and _common(best, issue.path) > in_file:
            return Issue(issue.path, issue.message, issue.hint, sources[best])
    return issue


def _common(a: tuple[str | int, ...], b: tuple[str | int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def load_spec(
    path: str | os.PathLike[str] | None,
    *,
    overrides: list[str] = (),  # type: ignore[assignment]
    base: Mapping[str, object] | None = None,
    text: str | None = None,
    defaults: list[Layer] = (),  # type: ignore[assignment]
    values: list[tuple[tuple[str, ...], object, str]] = (),  # type: ignore[assignment]
) -> LoadedSpec:
    """Load, override and validate a spec. Raises ``SpecError`` with every problem found.

    Args:
        path: the YAML file, or None for a spec built only from ``base`` and overrides
            (``ddpjob submit -- python train.py``).
        overrides: ``KEY=VALUE`` strings applied in order before validation.
        base: starting data when ``path`` is None.
        text: the spec's text when it was read already (standard input); ``path`` then only names it.
        defaults: the project file and user config (``spec.defaults.layers``): they fill what the
            spec leaves out.
        values: ``(field path, value, source)`` set over the spec before the overrides, taken as
            given (not parsed as YAML): ``--env-file``, ``--env``, ``--notify``, ``--notify-url``.
    """
    file = str(path) if path is not None else None
    locations: dict[tuple[str | int, ...], tuple[int, int]] = {}
    issues: list[Issue] = []
    if path is not None:
        if text is None:
            text = specyaml.read_spec_text(str(path))
        parsed, locations, issues = specyaml.parse(text, file)
        if parsed is None:
            parsed = {}
        if not isinstance(parsed, dict):
            raise SpecError(file, [Issue((), f"the spec must be a mapping of fields, not a {type(parsed).__name__}")], locations)
        data: dict[str, object] = parsed
    else:
        data = dict(base or {})

    filled = fill(data, list(defaults))
    sources: dict[tuple[str | int, ...], str] = dict(filled)
    for parts, value, src in values:
        problem = _apply(data, parts, value, src)
        if problem:
            issues.append(problem)
        sources[parts] = src
    for text_override in overrides:
        parts, value = parse_override(text_override)
        src = override_source(text_override)
        problem = _apply(data, parts, value, src)
        if problem:
            issues.append(problem)
        sources[parts] = src
    drop_idle_notify(data, {p: s for p, s in filled.items() if sources.get(p) == s})

    unreadable = unreadable_values(data)
    issues.extend(unreadable)
    if any(i.hint == HUGE_HINT for i in unreadable):  # not validated: no message could show such a number
        issues = [_with_source(i, sources, locations if file is not None else None) for i in issues]
        raise SpecError(file, sorted(issues, key=lambda i: (i.source is not None, _line_of(i, locations))), locations)
    spec: JobSpec | None = None
    try:
        with interrupt_after():  # the first validation builds the validators: no Ctrl-C in the middle
            spec = spec_model().model_validate(data)
    except ValidationError as e:
        issues.extend(_issues_from_pydantic(e, data))
    if spec is not None:
        issues.extend(check_placeholders(spec))
        issues.extend(size_issues(spec.nodes, spec.procs_per_node, spec.resources.gpus,
                                  [len(v) for v in spec.sweep.values()]))
        issues.extend(recovery_issues(spec.nodes, spec.recovery))
    if issues:
        issues = [_with_source(i, sources, locations if file is not None else None) for i in issues]
        issues.sort(key=lambda i: (i.source is not None, _line_of(i, locations)))
        raise SpecError(file, issues, locations)
    assert spec is not None
    if file is not None and spec.workdir is not None and not os.path.isabs(spec.workdir) and spec.workdir.strip():
        # Relative workdirs are relative to the spec file, so a spec means the same wherever you submit it.
        resolved = str((Path(file).resolve().parent / spec.workdir).resolve())
        spec = spec.model_copy(update={"workdir": resolved})
    return LoadedSpec(spec, file, locations, sources, default_target(list(defaults)))


STDIN_NAME = "<stdin>"


def read_stdin_text() -> str:
    """The text of a spec piped to standard input (``ddpjob validate -``), under a file's bounds."""
    import sys

    def refuse(message: str, hint: str | None = None) -> SpecError:
        return SpecError(STDIN_NAME, [Issue((), message, hint)])

    stream = sys.stdin
    if stream is None or stream.closed:
        raise refuse("there is no standard input to read a spec from", "pipe a spec into it: ddpjob validate - < spec.yaml")
    if stream.isatty():
        raise refuse("standard input is a terminal", "pipe a spec into it: cat spec.yaml | ddpjob validate -")
    limit = specyaml.max_bytes()
    try:
        data = stream.buffer.read(limit + 1)
    except OSError as e:
        raise refuse(f"cannot read standard input: {e.strerror or e}") from e
    if len(data) > limit:
        raise refuse(f"more than {limit:,} bytes; a job spec is a few kilobytes",
                     "raise DDPJOB_SPEC_MAX_BYTES if this really is a spec")
    return specyaml.decode_spec(data, STDIN_NAME, "send UTF-8 text")


# An integer of more digits than Python turns into text (its limit, 4,300) cannot be shown in an
# error, written into a command or compared usefully; hex, binary and YAML 1.1's base 60 (1:30) read
# into one without that limit. No field needs more than a few digits.
MAX_INT_DIGITS = 4300
_MAX_INT_BITS = int(MAX_INT_DIGITS * 3.3219)


def unreadable_values(data: object, path: tuple[str | int, ...] = ()) -> list[Issue]:
    """Every string holding a NUL byte (no path, argument or variable can hold one), every
    integer too long to write out and bytes (from the Python API), keys included."""
    if isinstance(data, str):
        return [Issue(path, "contains a NUL byte, which no path, argument or variable can hold")] if "\x00" in data else []
    if isinstance(data, int) and not isinstance(data, bool):
        return [_huge(path)] if data.bit_length() > _MAX_INT_BITS else []
    if isinstance(data, (bytes, bytearray)):  # only from the Python API: YAML gives no bytes (!!binary is refused)
        return [Issue(path, "bytes, not text", "decode them first, e.g. value.decode()")]
    items: Iterable[tuple[object, object]] = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    out: list[Issue] = []
    for key, value in items:
        if isinstance(key, str) and "\x00" in key:
            out.append(Issue(path, "a key contains a NUL byte"))
        if isinstance(key, int) and not isinstance(key, bool) and key.bit_length() > _MAX_INT_BITS:
            out.append(_huge(path))
            continue
        out += unreadable_values(value, path + (key if isinstance(key, (str, int)) else str(key),))
    return out


def _huge(path: tuple[str | int, ...]) -> Issue:
    return Issue(path, f"a number of more than {MAX_INT_DIGITS:,} digits is too long to read", HUGE_HINT)


HUGE_HINT = "no field needs such a number; quote it to keep it as text"


def _line_of(issue: Issue, locations: dict[tuple[str | int, ...], tuple[int, int]]) -> tuple[int, int]:
    for cut in range(len(issue.path), -1, -1):
        if tuple(issue.path[:cut]) in locations:
            return locations[tuple(issue.path[:cut])]
    return (0, 0)


def _issues_from_pydantic(e: ValidationError, data: object) -> list[Issue]:
    merged: dict[tuple[str | int, ...], list[ErrorDetails]] = {}
    for err in e.errors(include_url=False):
        path = _clean_loc(err["loc"], data, err["type"])
        merged.setdefault(path, []).append(err)
    issues = []
    for path, errs in merged.items():
        first = errs[0]
        if first["type"] == "extra_forbidden":
            key = str(path[-1])
            allowed = allowed_keys(path[:-1])
            import difflib

            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else (f"known fields: {', '.join(allowed)}" if allowed else None)
            issues.append(Issue(path, f"unknown field {key!r}", hint))
            continue
        if first["type"] == "missing":
            issues.append(Issue(path, "required field is missing", _missing_hint(path)))
            continue
        msgs: list[str] = []
        for err in errs:
            msg = err["msg"].removeprefix("Value error, ")
            if msgs and msg.startswith("Input should be "):
                msg = msg.removeprefix("Input should be ")
            if msg not in msgs:
                msgs.append(msg)
        message = " or ".join(msgs) if len(msgs) > 1 else msgs[0]
        value = first.get("input")
        # env as a whole (`--set env=...` taken as text) may hold a secret's value too; a notify URL's
        # path is often a webhook's secret.
        secret = (path[:1] == ("env",) and (len(path) == 1 or is_secret(str(path[1]), value))) or path[:2] == ("notify", "url")
        shown = repr(value) not in message and (str(value) not in message or not str(value))
        if not secret and isinstance(value, (int, float, str, bool)) and len(repr(value)) <= 60 and shown:
            message += f" (got {value!r})"
        issues.append(Issue(path, message, _hint(path, value, first["type"])))
    return issues


# The memory fields: Kubernetes quantities, or sbatch's --mem for slurm.memory (text with a unit).
_MEMORY_FIELDS = {("resources", "memory"), ("resources", "shm"), ("slurm", "memory")}


def _hint(path: tuple[str | int, ...], value: object, err_type: str) -> str | None:
    """What to write instead, where the mistake is a common one."""
    if path == ("name",) and isinstance(value, str):
        return f"for example name: {sanitize_name(value)}"
    if path in _MEMORY_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"add a unit, e.g. {path[-1]}: {value:g}Mi or 2Gi (a size is text with its unit)"
    if path == ("command",) and isinstance(value, str) and err_type == "list_type":
        words = value.split()
        return ("write it as a list, one argument per item: command: [" + ", ".join(words[:6])
                + (", ..." if len(words) > 6 else "") + "] (it is never run through a shell)")
    return None


def _missing_hint(path: tuple[str | int, ...]) -> str | None:
    if path == ("name",):
        return "add e.g. `name: my-job` (lowercase letters, digits, '-')"
    if path == ("command",):
        return "add e.g. `command: [python, train.py]`"
    return None


def _clean_loc(loc: tuple[int | str, ...], data: object, err_type: str) -> tuple[str | int, ...]:
    """Drop pydantic's union/validator tags from ``loc`` by walking the real data."""
    out: list[str | int] = []
    cur = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if (isinstance(cur, dict) and part in cur) or (isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)):
            out.append(part)
            cur = cur[part] if isinstance(cur, dict) else cur[int(part)]
        elif last and err_type in ("missing", "extra_forbidden"):
            out.append(part)
        # else: a tag such as 'int', "literal['auto']" or 'function-after[...]': not a data key.
    return tuple(out)


def allowed_keys(path: tuple[str | int, ...], model: type[BaseModel] | None = None) -> list[str]:
    """Field names of the model found at ``path`` (the spec's, ``spec_model()``, by default; for typo
    suggestions); [] if not a model."""
    tp: object = spec_model() if model is None else model
    for part in path:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            f = tp.model_fields.get(str(part))
            if f is None:
                return []
            tp = f.annotation
        else:
            origin = typing.get_origin(tp)
            args = typing.get_args(tp)
            if origin in (list, tuple) and args:
                tp = args[0]
            elif origin is dict and len(args) == 2:
                tp = args[1]
            else:
                return []
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return []


def _unwrap(tp: object) -> object:
    """Optional[X] / X | None / Annotated[X, ...] -> X (the first model in a union, if any)."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            tp = models[0] if models else (args[0] if len(args) == 1 else tp)
            if typing.get_origin(tp) in (typing.Union, types.UnionType):
                return tp
            continue
        return tp
