"""The values of the spec's secret-named env variables on their way to a local job's nodes: per
"run/node", in the supervisor's environment (``SECRET_ENV``, which it removes at once), never in
plan.json. A process's environment is readable by its user alone and gone with it.

The variable is ddpjob's own, apart from ``DDPJOB_SECRET_ENV`` (the user's globs of names to treat as
secret, ``launcher.spec.secrets``): sharing that name, a user who had set it could run no local job
(the supervisor read the globs as its JSON and stopped before any node started)."""

from __future__ import annotations

SECRET_ENV = "DDPJOB_SUPERVISOR_SECRETS"


def secrets_apart(data: dict[str, object], masked: frozenset[str]) -> tuple[object, str | None]:
    """``plan.json``'s data (``to_json`` of the payload) with the values of the ``masked`` env names
    as ``***``, and those values as the text of the supervisor's ``SECRET_ENV`` variable (None when
    there are none). A supervisor started by hand on such a plan starts its nodes with ``***`` for
    those values."""
    import json

    from launcher.targets.shared.files import mask_env_values

    values = {f"{el['index']}/{node['node']}": {n: v for n, v in _dict(node["env"]).items() if n in masked}
              for el in _dicts(data["elements"]) for node in _dicts(el["nodes"])}
    values = {key: env for key, env in values.items() if env}
    return mask_env_values(data, masked), (json.dumps(values) if values else None)


def _dict(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError(f"not a JSON object: {value!r}")  # to_json of a payload: never
    return value


def _dicts(value: object) -> list[dict[str, object]]:
    if not isinstance(value, list):
        raise TypeError(f"not a JSON list: {value!r}")  # to_json of a payload: never
    return [_dict(v) for v in value]
