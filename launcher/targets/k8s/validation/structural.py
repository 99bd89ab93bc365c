"""Validate an object against a Kubernetes *structural schema*: the OpenAPI v3 subset CRDs use.

The API server checks a custom resource against its CRD's ``openAPIV3Schema``; this module does
the same here, with the server's meaning where it differs from plain JSON Schema (``nullable``,
``x-kubernetes-int-or-string``, ``int32``/``int64`` formats as ranges). It knows the keywords a
structural schema may hold (type, properties, additionalProperties, required, items, enum, pattern,
format, minimum/maximum and their exclusive forms, min/max length, items and properties, anyOf,
allOf, oneOf, not, multipleOf, uniqueItems) and ignores the rest (descriptions, defaults, CEL
``x-kubernetes-validations``, which only the server can run).

Why not the ``jsonschema`` package: importing it costs about 50 ms, a quarter of
``ddpjob render --target k8s`` (tests/bench/cli_bench.py), and it knows neither ``nullable`` nor the
Kubernetes formats. A test compares the two on many broken manifests
(tests/k8s/test_k8s_structural.py).

Pure functions, no I/O: ``errors(instance, schema)`` yields ``(path, keyword, message)``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence

from launcher.core.jsondata import JSON, obj

Path_ = tuple[str | int, ...]
SchemaError = tuple[Path_, str, str]  # (path in the instance, the failing keyword, what is wrong)
Schema = Mapping[str, JSON]  # one (sub)schema: an object of the CRD's openAPIV3Schema

INT_RANGES: dict[object, tuple[int, int]] = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
# RFC 3339 date-time, as the API server's "date-time" format accepts it.
DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@functools.lru_cache(maxsize=256)
def _pattern(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


def is_type(value: object, name: str) -> bool:
    """JSON types as the API server decodes JSON (a bool is not a number; 2.0 is an integer)."""
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float))
    if name == "null":
        return value is None
    return True  # an unknown type name constrains nothing (the server refuses such a CRD)


def valid(instance: object, schema: object) -> bool:
    return next(errors(instance, schema), None) is None


def errors(instance: object, schema: object, path: Path_ = ()) -> Iterator[SchemaError]:
    """Every way ``instance`` breaks ``schema``, depth first."""
    if not isinstance(schema, dict):
        return
    if instance is None and schema.get("nullable"):
        return
    int_or_string = schema.get("x-kubernetes-int-or-string")
    if int_or_string and "anyOf" not in schema and not (is_type(instance, "integer") or isinstance(instance, str)):
        yield path, "x-kubernetes-int-or-string", f"{instance!r} is not an integer or a string"
        return
    kind = schema.get("type")
    if isinstance(kind, str) and not is_type(instance, kind):
        yield path, "type", f"{instance!r} is not of type {kind!r}"
        return  # the other keywords describe a value of that type
    yield from _keywords(instance, schema, path)


def _keywords(instance: object, schema: Schema, path: Path_) -> Iterator[SchemaError]:
    if "enum" in schema and not any(_same(instance, v) for v in _each(schema["enum"])):
        yield path, "enum", f"{instance!r} is not one of {schema['enum']!r}"
    if isinstance(instance, str):
        yield from _string(instance, schema, path)
    elif isinstance(instance, (int, float)) and not isinstance(instance, bool):
        yield from _number(instance, schema, path)
    elif isinstance(instance, list):
        yield from _array(instance, schema, path)
    elif isinstance(instance, dict):
        yield from _object(instance, schema, path)
    yield from _combinators(instance, schema, path)


def _string(value: str, schema: Schema, path: Path_) -> Iterator[SchemaError]:
    if (low := _limit(schema, "minLength")) is not None and len(value) < low:
        yield path, "minLength", f"{value!r} is too short (at least {low} characters)"
    if (high := _limit(schema, "maxLength")) is not None and len(value) > high:
        yield path, "maxLength", f"{value!r} is too long (at most {high} characters)"
    if "pattern" in schema and not _pattern(_regex(schema["pattern"])).search(value):
        yield path, "pattern", f"{value!r} does not match {schema['pattern']!r}"
    if schema.get("format") == "date-time" and not DATE_TIME.match(value):
        yield path, "format", f"{value!r} is not an RFC 3339 date-time"


def _number(value: float, schema: Schema, path: Path_) -> Iterator[SchemaError]:
    bounds = INT_RANGES.get(schema.get("format", ""))
    if bounds and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
        yield path, "format", f"{value!r} is out of range for {schema['format']}"
    low = _limit(schema, "minimum")
    if low is not None and (value < low or (schema.get("exclusiveMinimum") is True and value == low)):
        yield path, "minimum", f"{value!r} is less than the minimum of {low!r}"
    high = _limit(schema, "maximum")
    if high is not None and (value > high or (schema.get("exclusiveMaximum") is True and value == high)):
        yield path, "maximum", f"{value!r} is greater than the maximum of {high!r}"
    step = _limit(schema, "multipleOf") if schema.get("multipleOf") else None
    if step and not math.isclose(value / step, round(value / step)):
        yield path, "multipleOf", f"{value!r} is not a multiple of {step!r}"


def _array(items: Sequence[object], schema: Schema, path: Path_) -> Iterator[SchemaError]:
    if (low := _limit(schema, "minItems")) is not None and len(items) < low:
        yield path, "minItems", f"too few items ({len(items)}; at least {low})"
    if (high := _limit(schema, "maxItems")) is not None and len(items) > high:
        yield path, "maxItems", f"too many items ({len(items)}; at most {high})"
    if schema.get("uniqueItems") and len({_key(v) for v in items}) != len(items):
        yield path, "uniqueItems", "has duplicate items"
    item_schema = schema.get("items")
    if isinstance(item_schema, dict):
        for i, item in enumerate(items):
            yield from errors(item, item_schema, path + (i,))


def _object(instance: Mapping[str, object], schema: Schema, path: Path_) -> Iterator[SchemaError]:
    for name in _each(schema.get("required", [])):
        if name not in instance:
            yield path, "required", f"{name!r} is a required property"
    if (low := _limit(schema, "minProperties")) is not None and len(instance) < low:
        yield path, "minProperties", f"has {len(instance)} fields; at least {low} needed"
    if (high := _limit(schema, "maxProperties")) is not None and len(instance) > high:
        yield path, "maxProperties", f"has {len(instance)} fields; at most {high} allowed"
    props = obj(schema.get("properties"))  # not an object (no structural schema): no properties
    extra = schema.get("additionalProperties", True)
    for key, value in instance.items():
        if key in props:
            yield from errors(value, props[key], path + (key,))
        elif extra is False:
            known = sorted(props)
            listed = ", ".join(known[:12]) + ("..." if len(known) > 12 else "")
            yield path + (key,), "additionalProperties", f"unknown field {key!r} (known: {listed})"
        elif isinstance(extra, dict):
            yield from errors(value, extra, path + (key,))


def _combinators(instance: object, schema: Schema, path: Path_) -> Iterator[SchemaError]:
    if "anyOf" in schema and not any(valid(instance, s) for s in _each(schema["anyOf"])):
        yield path, "anyOf", f"{instance!r} is not valid under any of the given schemas"
    if "oneOf" in schema and sum(valid(instance, s) for s in _each(schema["oneOf"])) != 1:
        yield path, "oneOf", f"{instance!r} is not valid under exactly one of the given schemas"
    for sub in _each(schema.get("allOf", [])):
        yield from errors(instance, sub, path)
    if "not" in schema and valid(instance, schema["not"]):
        yield path, "not", f"{instance!r} must not be valid under {schema['not']!r}"


def _same(a: object, b: object) -> bool:
    """Equality as JSON sees it: True is not 1."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


# A malformed schema (one the API server would refuse in a CRD) is read as plain Python reads it: a
# keyword's list, object keys or string characters, and a TypeError where no value would do.

def _each(value: JSON) -> Sequence[JSON]:
    """What ``for v in value`` goes through: a list's items, an object's keys, a string's characters."""
    if isinstance(value, list):
        return value
    if isinstance(value, (dict, str)):
        return list(value)
    raise TypeError(f"{type(value).__name__!r} object is not iterable")


def _limit(schema: Schema, keyword: str) -> float | None:
    """A numeric keyword (``minLength``, ``minimum``, ...) as written; None when the schema has none."""
    if keyword not in schema:
        return None
    value = schema[keyword]
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"{keyword} is {value!r}, not a number")


def _regex(value: JSON) -> str:
    if isinstance(value, str):
        return value
    raise TypeError(f"pattern is {value!r}, not a string")


def _key(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)
