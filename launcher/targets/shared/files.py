"""Files that other processes read while they are written, and typed records stored as JSON.

``atomic_write`` is the one way ddpjob writes a file that another process may read at the same
moment (a supervisor's state, a node's record, a saved log): write a temporary file beside it,
then rename, so a reader sees the old or the new content, never half of it.

``to_json``/``from_json`` turn the targets' dataclasses (plans' payloads, handles) into JSON and
back, nested dataclasses, lists and dicts included. Keys a record does not know are ignored and
missing keys take the field's default, so records written by an older ddpjob still load.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from launcher.core.jsondata import JSON

# The local supervisor writes its state with these on a job's way to its first step: no dataclasses
# or pathlib at import time (to_json/from_json import what they need).
T = TypeVar("T")


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` with ``data`` in one step (temporary file in the same folder, then rename).
    When that fails (a full disk), ``path`` is left as it was and the temporary file is removed."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        # A full disk fails the write or the close: the old file stays, no half-written one beside it.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str | os.PathLike[str], data: object) -> None:
    """``data`` as indented, key-sorted JSON, written atomically."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


def read_json(path: str | os.PathLike[str]) -> JSON:
    """The JSON in ``path``, or None when it does not exist or is not (yet) valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            data: JSON = json.load(f)
            return data
    except (OSError, ValueError):
        return None


def mask_env_values(data: object, names: frozenset[str]) -> object:
    """JSON ``data`` with the values of ``names`` in every ``env`` mapping replaced by ``***``: a record
    of a plan kept without the secret values the scheduler already holds another way."""
    if isinstance(data, dict):
        return {k: ({n: ("***" if n in names else v) for n, v in val.items()} if k == "env" and isinstance(val, dict)
                    else mask_env_values(val, names)) for k, val in data.items()}
    if isinstance(data, list):
        return [mask_env_values(v, names) for v in data]
    return data


def to_json(obj: object) -> dict[str, object]:
    """A dataclass instance (nested ones included) as plain JSON data."""
    import dataclasses

    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"to_json takes a dataclass instance, not {type(obj).__name__}")
    return dataclasses.asdict(obj)


def from_json(cls: type[T], data: object) -> T:
    """Build dataclass ``cls`` from JSON data written by ``to_json``."""
    import dataclasses
    import typing

    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _convert(hints[f.name], data[f.name])
              for f in dataclasses.fields(cls) if f.init and f.name in data}  # type: ignore[arg-type]
    return cls(**kwargs)


def _convert(tp: object, value: object) -> object:
    import dataclasses
    import types
    import typing

    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_json(tp, value)
    if origin is list and args and isinstance(value, list):
        return [_convert(args[0], v) for v in value]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {k: _convert(args[1], v) for k, v in value.items()}
    return value
