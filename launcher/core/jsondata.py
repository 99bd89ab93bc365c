"""JSON as ddpjob reads and writes it: one type for a value whose shape is a file's or an API's.

``JSON`` is what ``json.loads`` returns; ``JSONObject`` a JSON object. Code that reads one narrows
it with the small accessors here (a wrong type reads as the given default, as a missing key does)
instead of holding it as ``Any``; code that builds one states its type and lets the checker see
every value. Standard library only (the job wings import it under ``if TYPE_CHECKING:`` alone).
"""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
JSONObject: TypeAlias = dict[str, JSON]
JSONList: TypeAlias = list[JSON]


def obj(value: object) -> JSONObject:
    """``value`` if it is a JSON object, else an empty one (a fresh dict: writing to it changes nothing)."""
    return value if isinstance(value, dict) else {}


def arr(value: object) -> JSONList:
    """``value`` if it is a JSON list, else an empty one."""
    return value if isinstance(value, list) else []


def at(value: object, *keys: str) -> JSON:
    """The value under ``keys`` in nested objects (``at(pod, "status", "phase")``); None where a key
    is missing or a step is not an object."""
    here: object = value
    for key in keys:
        if not isinstance(here, dict):
            return None
        here = here.get(key)
    return here if isinstance(here, (dict, list, str, int, float, bool)) or here is None else None


def text(value: object, default: str = "") -> str:
    """``value`` if it is a string, else ``default``."""
    return value if isinstance(value, str) else default


def number(value: object, default: float | None = None) -> float | None:
    """``value`` as a float if it is a number (not a bool), else ``default``."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def integer(value: object, default: int | None = None) -> int | None:
    """``value`` if it is an int (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def json_value(value: object) -> JSON:
    """``value`` as JSON: itself where it is JSON (lists and objects item by item, keys as text), else its
    text (what ``json.dumps(..., default=str)`` would write)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)
