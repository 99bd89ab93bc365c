"""Bounded YAML for job specs: what a hostile or broken file can cost is limited before it is parsed.

A spec is read only from a regular file of at most ``DDPJOB_SPEC_MAX_BYTES`` (1 MiB), and its event
stream is checked before any node is built: nesting depth, the number of values once aliases are
expanded (a 400-byte "billion laughs" file names 10^9 of them), string length, tags (only the
plain YAML types; ``!!python/...`` and friends are spec errors, never constructed) and keys (scalars
only). Only then is the document composed and constructed, with dates and ``=`` kept as the text
written and numbers too long for Python reported at their line. Every problem is a ``SpecError``
with the file, line and column. A message about the value of a secret-named variable
(``env.DB_PASSWORD``, see ``launcher.spec.secrets``) never quotes its text: not an alias, anchor
or tag name, nor the YAML library's own words about it.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from typing import TYPE_CHECKING

from launcher.core.errors import Issue, SpecError
from launcher.spec.secrets import is_secret

if TYPE_CHECKING:
    from typing import Protocol

    import yaml

    class _Where(Protocol):
        """A place in the text: a YAML mark (the library's or its C loader's) or ``_Mark``."""

        @property
        def line(self) -> int: ...
        @property
        def column(self) -> int: ...

    class _At(_Where, Protocol):
        @property
        def index(self) -> int: ...

MAX_BYTES_DEFAULT = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 50_000
MAX_STRING = 65_536
# What YAML allows in a stream (PyYAML's Reader.NON_PRINTABLE): anything else is refused at its line.
# What YAML refuses. Compiling the class with its non-ASCII ranges costs ~3 ms, a tenth of what a
# render spends in ddpjob's own code, so an ASCII text (nearly every spec) is checked with the
# ASCII part alone and the full class is compiled only for text that needs it.
_UNPRINTABLE_ASCII = re.compile("[^\x09\x0A\x0D\x20-\x7E]")


@functools.cache
def _unprintable_any() -> re.Pattern[str]:
    return re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")
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

    if "\x00" in path:  # no file can have such a name (os.stat would raise ValueError)
        raise refuse("not a file name: it holds a NUL byte", "give the path of a YAML file")
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
    return decode_spec(data, path, "save the file as UTF-8")


def decode_spec(data: bytes, name: str, hint: str) -> str:
    """A spec's bytes as text (UTF-8, a leading BOM dropped); otherwise a SpecError at the bad byte's line."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpecError(name, [Issue((), f"not UTF-8 text (byte {data[e.start]:#04x})", hint)],
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
            except ValueError as e:  # more digits than Python converts (4300), or `!!int abc`
                digits = str(node.value).lstrip("+-").replace("_", "").isdigit()
                raise yaml.constructor.ConstructorError(
                    None, None, f"a number of {len(str(node.value)):,} characters is too long to read" if digits
                    else "a value tagged !!int is not a whole number", node.start_mark,
                ) from e

        def construct_checked_float(self, node: yaml.ScalarNode) -> float:
            try:
                return float(self.construct_yaml_float(node))
            except ValueError as e:  # `!!float abc`: the words of float() would quote the text
                raise yaml.constructor.ConstructorError(
                    None, None, "a value tagged !!float is not a number", node.start_mark) from e

    Loader.add_constructor("tag:yaml.org,2002:timestamp", Loader.construct_yaml_str)
    Loader.add_constructor("tag:yaml.org,2002:value", Loader.construct_yaml_str)
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_checked_int)
    Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_checked_float)
    return Loader


Path = tuple[str | int, ...]
SECRET_TEXT = "(its text is not shown: the value of a secret-named variable)"
SECRET_HINT = "quote the value to keep it as text: DB_PASSWORD: '*abc' (--set \"env.DB_PASSWORD='*abc'\")"


def _error(file: str | None, source: str | None, message: str, mark: _Where | None, hint: str | None = None,
           path: Path = ()) -> SpecError:
    locs: Locations = {path: (mark.line + 1, mark.column + 1)} if mark is not None and source is None else {}
    return SpecError(file, [Issue(path, message, hint, source)], locs)


def is_secret_path(path: Path) -> bool:
    """Whether ``path`` is, or lies inside, the value of a secret-named variable (``env.API_TOKEN``)."""
    return len(path) >= 2 and path[0] == "env" and is_secret(str(path[1]))


def _position(text: str, index: int) -> tuple[int, int]:
    """0-based line and column of ``text[index]`` (a YAML mark's numbering)."""
    line = text.count("\n", 0, index)
    return line, index - (text.rfind("\n", 0, index) + 1)


class _Mark:
    def __init__(self, line: int, column: int) -> None:
        self.line, self.column = line, column


def _unprintable(text: str, file: str | None, source: str | None, prefix: Path) -> SpecError | None:
    """The first character YAML refuses (a NUL byte, ESC ...), at its line and column; None if none."""
    m = (_UNPRINTABLE_ASCII if text.isascii() else _unprintable_any()).search(text)
    if m is None:
        return None
    what = "a NUL byte" if m.group() == "\x00" else f"the control character {m.group()!r}"
    return _error(file, source, f"the text holds {what}, which YAML does not allow", _Mark(*_position(text, m.start())),
                  "remove it: a spec is plain UTF-8 text", prefix)


class _Open:
    """An open collection in the event walk: a mapping or a list, whether a key comes next, the values
    it expands to, its anchor, and where the walk stands in it (the current key, or index)."""

    __slots__ = ("anchor", "index", "key", "mapping", "next_is_key", "values")

    def __init__(self, mapping: bool, anchor: str | None) -> None:
        self.mapping, self.next_is_key, self.values, self.anchor = mapping, True, 1, anchor
        self.key: str | None = None
        self.index = 0

    def at(self) -> str | int | None:
        return self.key if self.mapping else self.index


def check_events(text: str, file: str | None, source: str | None = None, prefix: Path = ()) -> None:
    """Walk the event stream once (no nodes are built) and refuse what would be costly or unsafe.

    ``prefix``: where the text goes in the spec (a ``--set``'s keys), to know a secret's value."""
    stack: list[_Open] = []
    anchors: dict[str, tuple[int, bool]] = {}  # anchor -> (values it expands to, is a collection)
    total = 0
    unprintable = _unprintable(text, file, source, prefix)
    if unprintable is not None:
        raise unprintable

    def where() -> Path:
        return prefix + tuple(at for top in stack if not (top.mapping and top.next_is_key) and (at := top.at()) is not None)

    def fail(message: str, event: yaml.Event, hint: str | None = None, secret_message: str | None = None) -> SpecError:
        path = where()
        if secret_message is not None and is_secret_path(path):
            message, hint = f"{secret_message} {SECRET_TEXT}", SECRET_HINT
        return _error(file, source, message, event.start_mark, hint, path[:12])

    import yaml

    try:
        for event in yaml.parse(text, Loader=_base()):
            if isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                tag = event.tag
                if tag is not None and tag not in _SAFE_TAGS:
                    raise fail(f"YAML tag {tag.replace('tag:yaml.org,2002:', '!!')} is not allowed in a spec",
                               event, "write plain values (strings, numbers, lists, mappings)",
                               "a YAML tag (a value starting with !) is not allowed in a spec")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)) and stack \
                    and stack[-1].mapping and stack[-1].next_is_key \
                    and (not isinstance(event, yaml.AliasEvent) or anchors.get(event.anchor or "", (0, False))[1]):
                raise fail("a mapping key must be a plain value, not a list or mapping", event,
                           "write `key: value` with a name as the key")
            anchor = getattr(event, "anchor", None) if not isinstance(event, yaml.AliasEvent) else None
            if anchor is not None and (anchor in anchors or any(top.anchor == anchor for top in stack)):
                raise fail(f"anchor &{anchor} is defined twice", event, "give each anchor its own name",
                           "a YAML anchor (&name) is defined twice")
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise fail(f"nested more than {MAX_DEPTH} levels deep", event, "a job spec nests a few levels")
                stack.append(_Open(isinstance(event, yaml.MappingStartEvent), event.anchor))
                continue
            if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                closed = stack.pop()
                size, anchor = closed.values, closed.anchor
                if anchor is not None:
                    anchors[anchor] = (size, True)
                count = size
            elif isinstance(event, yaml.ScalarEvent):
                if len(event.value) > MAX_STRING:
                    raise fail(f"a value of {len(event.value):,} characters; at most {MAX_STRING:,} are allowed",
                               event, "no program argument or variable needs that much; pass a file's path instead")
                if event.anchor is not None:
                    anchors[event.anchor] = (1, False)
                if stack and stack[-1].mapping and stack[-1].next_is_key:
                    stack[-1].key = event.value  # the key of the value that follows
                count = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    raise fail(f"alias *{event.anchor} refers to no anchor before it (or to the collection holding it)",
                               event, f"define &{event.anchor} earlier, outside this value",
                               "a YAML alias (a value starting with *) refers to no anchor before it")
                count = anchors[event.anchor][0]
            else:
                continue
            total += count
            if total > MAX_VALUES:
                raise fail(f"the spec holds more than {MAX_VALUES:,} values once its aliases (*name) are expanded",
                           event, "a job spec holds a few hundred; remove the repeated aliases")
            if stack:
                top = stack[-1]
                top.values += count
                if top.mapping:
                    top.next_is_key = not top.next_is_key
                else:
                    top.index += 1
    except yaml.YAMLError as e:
        # The library reads ahead of the events: its problem may lie in the value after the key
        # the walk stands at, so the words of an error there are those of that value.
        raise _syntax_error(e, file, source, where(), is_secret_path(where())) from e


def _syntax_error(e: yaml.YAMLError, file: str | None, source: str | None, path: Path = (),
                  secret: bool = False) -> SpecError:
    import yaml

    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    if re.search(r"nesting|depth", problem, re.IGNORECASE):
        # PyYAML >= 6.0.3 has a depth limit of its own, which its scanner (reading flow
        # collections ahead of the events) can hit before check_events sees the 65th level.
        return _error(file, source, f"nested more than {MAX_DEPTH} levels deep", mark, "a job spec nests a few levels",
                      path[:12])
    if secret:
        what = "cannot be read as YAML" if isinstance(e, yaml.constructor.ConstructorError) else "not valid YAML"
        return _error(file, source, f"{what} {SECRET_TEXT}", mark, SECRET_HINT, path[:12])
    if isinstance(e, yaml.constructor.ConstructorError):
        return _error(file, source, problem, mark, "quote the value to keep it as text")
    return _error(file, source, f"YAML syntax error: {problem}", mark, "check indentation, colons and quotes")


def parse(text: str, file: str | None, source: str | None = None,
          prefix: Path = ()) -> tuple[object, Locations, list[Issue]]:
    """Plain data from bounded YAML, a map from field path to (line, column), and duplicate keys.
    ``prefix``: where the text goes in the spec (a ``--set``'s keys)."""
    import yaml

    check_events(text, file, source, prefix)
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        raise _syntax_error(e, file, source, prefix, _secret_at(text, prefix, getattr(e, "problem_mark", None))) from e
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
        seen: dict[object, int] = {}  # YAML keys: any hashable value
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


def _secret_at(text: str, prefix: Path, mark: _At | None) -> bool:
    """Whether a construction error at ``mark`` lies in a secret's value (the events passed, so the
    text is a well-formed document: its node at the mark is found by composing it again)."""
    if is_secret_path(prefix):
        return True
    if mark is None:
        return False
    import yaml

    loader = _base()(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError:  # the document does not compose (a duplicate anchor): not a value's error
        return False
    finally:
        loader.dispose()
    if not isinstance(node, yaml.MappingNode):
        return False
    for key, value in node.value:
        if key.value == "env" and isinstance(value, yaml.MappingNode):
            return any(is_secret(str(k.value)) and v.start_mark.index <= mark.index <= v.end_mark.index
                       for k, v in value.value)
    return False


def parse_value(raw: str, source: str, prefix: Path = ()) -> object:
    """A ``--set`` value as YAML (``4``, ``[a, b]``, ``{x: 1}``) under the same bounds as a file;
    text that is not valid YAML is taken as the string written. ``prefix``: the keys it sets."""
    if raw.isascii() and raw.isdigit() and len(raw) < 19 and (raw == "0" or raw[0] != "0"):
        return int(raw)  # a plain decimal (--nodes 2), as YAML reads it, without loading a YAML parser
    try:
        return parse(raw, None, source, prefix)[0]
    except SpecError as e:
        if e.issues and e.issues[0].message.startswith(("YAML syntax error", "not valid YAML")):
            return raw
        raise
