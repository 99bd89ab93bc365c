"""Bounded YAML for job specs: what a hostile or broken file can cost is limited before it is parsed.

A spec is read only from a regular file of at most ``DDPJOB_SPEC_MAX_BYTES`` (1 MiB), and its event
stream is checked before any node is built: nesting depth, the number of values once aliases are
expanded (a 400-byte "billion laughs" file names 10^9 of them), string length, tags (only the
plain YAML types; ``!!python/...`` and friends are spec errors, never constructed) and keys (scalars
only). Only then is the document composed and constructed, with dates and ``=`` kept as the text
written and numbers too long for Python reported at their line. Every problem is a ``SpecError``
with the file, line and column.
"""

from __future__ import annotations

import functools
import os
import stat
from typing import TYPE_CHECKING, Any

from launcher.core.errors import Issue, SpecError

if TYPE_CHECKING:
    import yaml

MAX_BYTES_DEFAULT = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 50_000
MAX_STRING = 65_536
_SAFE_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq", "map")} | {"!"}

Locations = dict[tuple[str | int, ...], tuple[int, int]]


def max_bytes() -> int:
    """The size cap of a spec file: ``$DDPJOB_SPEC_MAX_BYTES`` or 1 MiB."""
    try:
        return max(1, int(os.environ.get("DDPJOB_SPEC_MAX_BYTES") or MAX_BYTES_DEFAULT))
    except ValueError:
        return MAX_BYTES_DEFAULT


def read_spec_text(path: str) -> str:
    """The text of a spec file; refuses at once what is not a regular file of bounded size."""

    def refuse(message: str, hint: str | None = None, cause: BaseException | None = None) -> SpecError:
        err = SpecError(path, [Issue((), message, hint)])
        err.__cause__ = cause
        return err

    try:
        st = os.stat(path)  # follows symlinks: a link to /dev/zero is a device
    except FileNotFoundError as e:
        from launcher.spec.examples import hint_for_missing

        hint = hint_for_missing(path) or "check the path; `ddpjob validate FILE` checks a spec"
        raise refuse("file not found", hint, e) from e
    except OSError as e:
        raise refuse(f"cannot read the file: {e.strerror or e}", cause=e) from e
    if not stat.S_ISREG(st.st_mode):
        raise refuse(f"not a regular file ({_kind(st.st_mode)})", "give the path of a YAML file")
    limit = max_bytes()
    try:
        # O_NONBLOCK: if the path is swapped for a FIFO after the stat, open does not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise refuse("not a regular file", "give the path of a YAML file")
            data = f.read(limit + 1)
    except OSError as e:
        raise refuse(f"cannot read the file: {e.strerror or e}", cause=e) from e
    if len(data) > limit:
        raise refuse(f"the file is larger than {limit:,} bytes; a job spec is a few kilobytes",
                     "raise DDPJOB_SPEC_MAX_BYTES if this really is a spec")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpecError(path, [Issue((), f"not UTF-8 text (byte {data[e.start]:#04x})", "save the file as UTF-8")],
                        {(): (line, column)}) from e


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


@functools.cache
def _base() -> type:
    """PyYAML's safe loader, libyaml's when available (~50x faster). PyYAML is imported on first use:
    a job given as a command (``ddpjob submit -- python train.py``) never reads YAML."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _loader() -> type:
    import yaml

    class Loader(_base()):  # type: ignore[misc]
        """SafeLoader (no arbitrary objects). YAML 1.1 quirks such as `on: yes` stay as PyYAML reads
        them; dates and a lone ``=`` stay the text written (a spec has no date fields)."""

        def construct_checked_int(self, node: yaml.ScalarNode) -> int:
            try:
                return int(self.construct_yaml_int(node))
            except ValueError as e:  # more digits than Python converts (4300)
                raise yaml.constructor.ConstructorError(
                    None, None, f"a number of {len(str(node.value)):,} characters is too long to read",
                    node.start_mark,
                ) from e

    Loader.add_constructor("tag:yaml.org,2002:timestamp", Loader.construct_yaml_str)
    Loader.add_constructor("tag:yaml.org,2002:value", Loader.construct_yaml_str)
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_checked_int)
    return Loader


def _error(file: str | None, source: str | None, message: str, mark: Any, hint: str | None = None,
           path: tuple[str | int, ...] = ()) -> SpecError:
    locs: Locations = {path: (mark.line + 1, mark.column + 1)} if mark is not None and source is None else {}
    return SpecError(file, [Issue(path, message, hint, source)], locs)


def check_events(text: str, file: str | None, source: str | None = None) -> None:
    """Walk the event stream once (no nodes are built) and refuse what would be costly or unsafe."""
    # Per open collection: [is_mapping, next_is_key, values, anchor, current key or index].
    stack: list[list[Any]] = []
    anchors: dict[str, tuple[int, bool]] = {}  # anchor -> (values it expands to, is a collection)
    total = 0

    def fail(message: str, event: Any, hint: str | None = None) -> SpecError:
        path = tuple(top[4] for top in stack if not (top[0] and top[1]) and top[4] is not None)[:12]
        return _error(file, source, message, event.start_mark, hint, path)

    import yaml

    try:
        for event in yaml.parse(text, Loader=_base()):
            if isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                tag = event.tag
                if tag is not None and tag not in _SAFE_TAGS:
                    raise fail(f"YAML tag {tag.replace('tag:yaml.org,2002:', '!!')} is not allowed in a spec",
                               event, "write plain values (strings, numbers, lists, mappings)")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)) and stack \
                    and stack[-1][0] and stack[-1][1] \
                    and (not isinstance(event, yaml.AliasEvent) or anchors.get(event.anchor or "", (0, False))[1]):
                raise fail("a mapping key must be a plain value, not a list or mapping", event,
                           "write `key: value` with a name as the key")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise fail(f"nested more than {MAX_DEPTH} levels deep", event, "a job spec nests a few levels")
                stack.append([isinstance(event, yaml.MappingStartEvent), True, 1, event.anchor,
                              None if isinstance(event, yaml.MappingStartEvent) else 0])
                continue
            if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                _, _, size, anchor, _ = stack.pop()
                if anchor is not None:
                    anchors[anchor] = (size, True)
                count = size
            elif isinstance(event, yaml.ScalarEvent):
                if len(event.value) > MAX_STRING:
                    raise fail(f"a value of {len(event.value):,} characters; at most {MAX_STRING:,} are allowed",
                               event, "no program argument or variable needs that much; pass a file's path instead")
                if event.anchor is not None:
                    anchors[event.anchor] = (1, False)
                if stack and stack[-1][0] and stack[-1][1]:
                    stack[-1][4] = event.value  # the key of the value that follows
                count = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    raise fail(f"alias *{event.anchor} refers to no anchor before it (or to the collection holding it)",
                               event, f"define &{event.anchor} earlier, outside this value")
                count = anchors[event.anchor][0]
            else:
                continue
            total += count
            if total > MAX_VALUES:
                raise fail(f"the spec holds more than {MAX_VALUES:,} values once its aliases (*name) are expanded",
                           event, "a job spec holds a few hundred; remove the repeated aliases")
            if stack:
                top = stack[-1]
                top[2] += count
                if top[0]:
                    top[1] = not top[1]
                else:
                    top[4] += 1
    except yaml.YAMLError as e:
        raise _syntax_error(e, file, source) from e


def _syntax_error(e: yaml.YAMLError, file: str | None, source: str | None) -> SpecError:
    import yaml

    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    if isinstance(e, yaml.constructor.ConstructorError):
        return _error(file, source, problem, mark, "quote the value to keep it as text")
    if "maximum nesting depth" in problem:
        # PyYAML >= 6.0.3 has a depth limit of its own, which its scanner (reading flow
        # collections ahead of the events) can hit before check_events sees the 65th level.
        return _error(file, source, f"nested more than {MAX_DEPTH} levels deep", mark, "a job spec nests a few levels")
    return _error(file, source, f"YAML syntax error: {problem}", mark, "check indentation, colons and quotes")


def parse(text: str, file: str | None, source: str | None = None) -> tuple[Any, Locations, list[Issue]]:
    """Plain data from bounded YAML, a map from field path to (line, column), and duplicate keys."""
    import yaml

    check_events(text, file, source)
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        raise _syntax_error(e, file, source) from e
    finally:
        loader.dispose()
    locations: Locations = {}
    issues: list[Issue] = []
    if node is not None:
        locations[()] = (node.start_mark.line + 1, node.start_mark.column + 1)
        _walk(node, (), locations, issues)
    return data, locations, issues


def _walk(n: yaml.Node, path: tuple[str | int, ...], locations: Locations, issues: list[Issue]) -> None:
    """Record where each field is (bounded: ``check_events`` capped the expanded size and depth)."""
    import yaml

    if isinstance(n, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in n.value:
            key = key_node.value
            sub = path + (key,)
            if key in seen:
                issues.append(Issue(sub, f"duplicate key {key!r} (first on line {seen[key]})", hint="keep one of them"))
            seen[key] = key_node.start_mark.line + 1
            locations[sub] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk(value_node, sub, locations, issues)
    elif isinstance(n, yaml.SequenceNode):
        for i, item in enumerate(n.value):
            locations[path + (i,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, path + (i,), locations, issues)


def parse_value(raw: str, source: str) -> Any:
    """A ``--set`` value as YAML (``4``, ``[a, b]``, ``{x: 1}``) under the same bounds as a file;
    text that is not valid YAML is taken as the string written."""
    if raw.isascii() and raw.isdigit() and len(raw) < 19 and (raw == "0" or raw[0] != "0"):
        return int(raw)  # a plain decimal (--nodes 2), as YAML reads it, without loading a YAML parser
    try:
        return parse(raw, None, source)[0]
    except SpecError as e:
        if e.issues and e.issues[0].message.startswith("YAML syntax error"):
            return raw
        raise
