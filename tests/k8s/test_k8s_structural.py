"""ddpjob's structural-schema validator (``launcher.targets.k8s.validation.structural``): each keyword with the
API server's meaning, and the same verdicts as the ``jsonschema`` package on thousands of broken
manifests, against a schema of our own (always) and the upstream CRDs (when the tests have them)."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from fake_apiserver import upstream_schema
from test_k8s_schema import job as pytorchjob
from testkit import TESTS_HOME, needs_crd
from trainjob_kit import needs_trainjob_crd, trainjob_schema

from launcher.targets.k8s.validation.schema import strict_schema
from launcher.targets.k8s.validation.structural import errors

# A schema in the shape controller-gen writes, with every keyword the validator knows.
OWN = strict_schema({
    "type": "object",
    "required": ["name", "replicas"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12, "pattern": "^[a-z][-a-z0-9]*$"},
        "replicas": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 64},
        "big": {"type": "integer", "format": "int64"},
        "ratio": {"type": "number", "multipleOf": 0.5},
        "policy": {"type": "string", "enum": ["Always", "Never"]},
        "quantity": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
                     "pattern": "^[0-9]+[mMGK]?i?$"},
        "ports": {"type": "array", "maxItems": 3, "minItems": 1, "items": {
            "type": "object", "required": ["port"],
            "properties": {"port": {"type": "integer", "format": "int32"}, "tls": {"type": "boolean"}}}},
        "labels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"known": {"type": "string"}}},
        "mode": {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "string", "pattern": "^b"}]},
        "sizes": {"type": "array", "uniqueItems": True, "items": {"type": "integer"}},
        "combined": {"allOf": [{"type": "string"}, {"minLength": 2}], "not": {"enum": ["no"]}},
    },
})
GOOD = {"name": "w-1", "replicas": 2, "big": 2**40, "ratio": 1.5, "policy": "Never", "quantity": "2Gi",
        "ports": [{"port": 29500, "tls": False}], "labels": {"a": "b"}, "free": {"known": "x", "other": 1},
        "mode": "b2", "sizes": [1, 2], "combined": "ok"}


def paths(instance: Any, schema: dict[str, Any]) -> list[tuple[tuple, str]]:
    return sorted((p, k) for p, k, _ in errors(instance, schema))


def test_a_valid_object_has_no_errors():
    assert paths(GOOD, OWN) == []


@pytest.mark.parametrize("key,value,keyword", [
    ("name", "", "minLength"), ("name", "x" * 13, "maxLength"), ("name", "Bad", "pattern"), ("name", 5, "type"),
    ("replicas", 0, "minimum"), ("replicas", 65, "maximum"), ("replicas", True, "type"), ("replicas", "2", "type"),
    ("replicas", 1.5, "type"), ("big", 2**63, "format"), ("ratio", 0.7, "multipleOf"), ("policy", "always", "enum"),
    ("quantity", 0.5, "anyOf"), ("quantity", [], "anyOf"), ("ports", [], "minItems"), ("ports", [{}] * 4, "maxItems"),
    ("labels", {}, "minProperties"), ("mode", "c", "oneOf"), ("sizes", [1, 1], "uniqueItems"),
    ("combined", "x", "minLength"), ("combined", "no", "not"),
])
def test_each_keyword_refuses_what_the_api_server_would(key, value, keyword):
    obj = {**GOOD, key: value}
    assert (key,) in [p for p, _ in paths(obj, OWN)] and keyword in [k for _, k in paths(obj, OWN)], paths(obj, OWN)


def test_kubernetes_meanings():
    # int32 is a range, not a string format; 2.0 is an integer (JSON has one number type)
    assert paths({**GOOD, "replicas": 2**31}, OWN) == [(("replicas",), "format"), (("replicas",), "maximum")]
    assert paths({**GOOD, "replicas": 2.0}, OWN) == []
    # unknown fields are named one by one; preserve-unknown-fields keeps them, but still types what it knows
    assert paths({**GOOD, "nme": 1, "zz": 2}, OWN) == [(("nme",), "additionalProperties"), (("zz",), "additionalProperties")]
    assert paths({**GOOD, "free": {"known": 1, "x": {"y": 2}}}, OWN) == [(("free", "known"), "type")]
    # required fields, nested paths, nullable and int-or-string without anyOf
    assert paths({"name": "a", "ports": [{"tls": "yes"}]}, OWN) == [
        ((), "required"), (("ports", 0), "required"), (("ports", 0, "tls"), "type")]
    assert paths(None, {"type": "string", "nullable": True}) == []
    assert paths(None, {"type": "string"}) == [((), "type")]
    assert paths(3, {"x-kubernetes-int-or-string": True}) == paths("3", {"x-kubernetes-int-or-string": True}) == []
    assert paths(0.5, {"x-kubernetes-int-or-string": True}) == [((), "x-kubernetes-int-or-string")]
    assert paths("2026-11-23T10:00:00Z", {"type": "string", "format": "date-time"}) == []
    assert paths("yesterday", {"type": "string", "format": "date-time"}) == [((), "format")]
    # a bool is not 1, and 1 is not True
    assert paths(True, {"enum": [1]}) == [((), "enum")] and paths(1, {"enum": [True]}) == [((), "enum")]
    message = next(errors({**GOOD, "nme": 1}, OWN))[2]
    assert message.startswith("unknown field 'nme' (known: big, combined, free, labels,")


# --------------------------------------------------------------------------- against jsonschema

WRONG = ["x", "", -1, 2**31, 2**63, 0.5, True, None, [], [1], {}, {"zz": 1}]


def leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))


def mutants(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The object with one value replaced by each wrong value, and with an unknown key in each map."""
    for path in leaves(obj):
        if not path:
            continue
        for value in WRONG:
            bad = copy.deepcopy(obj)
            node = bad
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = copy.deepcopy(value)
            yield bad
        node = _at(obj, path)
        if isinstance(node, dict):
            bad = copy.deepcopy(obj)
            _at(bad, path)["zzUnknown"] = 1
            yield bad


def _at(obj: Any, path: tuple) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def jsonschema_paths(instance: Any, schema: dict[str, Any]) -> set[tuple]:
    """Where the jsonschema package finds errors, with the API server's int formats (as ddpjob's
    strict check used it before it had its own validator)."""
    jsonschema = pytest.importorskip("jsonschema")
    checker = jsonschema.FormatChecker(formats=())
    for fmt, (lo, hi) in {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}.items():
        checker.checks(fmt)(lambda v, lo=lo, hi=hi: not isinstance(v, int) or isinstance(v, bool) or lo <= v <= hi)
    out = set()
    for err in jsonschema.Draft7Validator(schema, format_checker=checker).iter_errors(instance):
        path = tuple(err.absolute_path)
        if err.validator == "additionalProperties":
            out |= {path + (k,) for k in set(err.instance) - set(err.schema.get("properties", {}))}
        else:
            out.add(path)
    return out


class Verdicts:
    """``jsonschema_paths`` over one schema, each answer kept between runs: the package is the reference
    here, and it takes twice as long as the validator under test on the thousands of mutants (~2.5 s of
    the upstream TrainJob CRD's ~3.5 s). The file is keyed by the schema, the jsonschema version and
    this module's code of the check, and holds an answer per instance (by the SHA-256 of its JSON), so an
    answer read from it is the one jsonschema gives; anything else, or a file that does not read, is asked again. It
    lives outside the checkout (testkit.TESTS_HOME)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        from importlib.metadata import version

        self.schema = schema
        key = json.dumps([schema, version("jsonschema"), inspect.getsource(jsonschema_paths)], sort_keys=True)
        self.path = TESTS_HOME / "jsonschema-verdicts" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
        try:
            self.known: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.new = 0

    def __call__(self, instance: Any) -> set[tuple]:
        text = hashlib.sha256(json.dumps(instance, sort_keys=True).encode()).hexdigest()
        if text not in self.known:
            self.known[text] = sorted(map(list, jsonschema_paths(instance, self.schema)), key=str)
            self.new += 1
        return {tuple(p) for p in self.known[text]}

    def save(self) -> None:
        if self.new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            part = self.path.with_suffix(f".{os.getpid()}.part")  # another process may write it too
            part.write_text(json.dumps(self.known))
            os.replace(part, self.path)


def ours(instance: Any, schema: dict[str, Any]) -> set[tuple]:
    return {p for p, _, _ in errors(instance, schema)}


def differences(good: dict[str, Any], schema: dict[str, Any]) -> tuple[int, list]:
    assert ours(good, schema) == jsonschema_paths(good, schema) == set()
    count, diffs, verdicts = 0, [], Verdicts(schema)
    for bad in mutants(good):
        count += 1
        mine, theirs = ours(bad, schema), verdicts(bad)
        if mine != theirs:
            diffs.append((json.dumps(bad)[:300], sorted(mine, key=str), sorted(theirs, key=str)))
    verdicts.save()
    return count, diffs


def test_same_verdicts_as_jsonschema_on_our_schema():
    count, diffs = differences(GOOD, OWN)
    assert count > 200 and diffs == [], diffs[:3]


@needs_crd
def test_same_verdicts_as_jsonschema_on_the_pytorchjob_crd():
    count, diffs = differences(pytorchjob(2), upstream_schema())
    assert count > 500 and diffs == [], diffs[:3]


@needs_trainjob_crd
def test_same_verdicts_as_jsonschema_on_the_trainjob_crd():
    from test_k8s_trainjob_render import TJ, plan_of

    count, diffs = differences(plan_of("quickstart.yaml", TJ).payload.manifests[0], trainjob_schema())
    assert count > 500 and diffs == [], diffs[:3]
