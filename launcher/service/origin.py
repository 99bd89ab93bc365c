"""Where a job's spec came from, and the spec a rerun submits again.

The registry keeps each job's spec with the values of secret-named variables masked (``***``), and
beside it the job's *origin*: the folder it was submitted from, the spec file (absolute), for each
secret variable where its value came from (``file``: the spec file; ``set``: a ``--set`` on the
command line, or standard input), and, for a rerun, the job it reruns. Names only, never a value:
of the values, only their salted hashes (``marks``), to find them again in what the job prints.

``rerun_spec`` turns a recorded job back into a loaded spec: the recorded spec, each masked value
read again from the same source (the spec file, still at its path) or given again with ``--set
env.NAME=VALUE``, then the rerun's own overrides. ``env_from_host`` names are read from the
submitting shell at submit, as for any job. A value that cannot be found again is refused (exit 2)
with the way to give it; no value is ever stored to make a rerun possible.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.spec.secrets import MASK, is_secret

if TYPE_CHECKING:
    from launcher.service.registry import JobRecord
    from launcher.spec.load import LoadedSpec

_STDIN = "<stdin>"  # launcher.spec.load.STDIN_NAME (not imported: that module loads pydantic)


def origin_of(loaded: LoadedSpec) -> dict[str, object]:
    """The origin the registry records for a job submitted from ``loaded`` (names, never values),
    with the marks of its secret values (``marks``: ``launcher.core.tokens.Marks``, salted hashes by
    which status, logs and notifications find them again in what the job prints)."""
    from launcher.spec.secrets import marks_of

    host = {n: os.environ[n] for n in loaded.spec.env_from_host if n in os.environ}
    marks = marks_of(loaded.spec.env, host)
    return {**_origin(loaded), **({"marks": marks.to_json()} if marks else {})}


def _origin(loaded: LoadedSpec) -> dict[str, object]:
    if loaded.origin is not None:
        return loaded.origin
    file = loaded.file if loaded.file not in (None, _STDIN) else None
    spec_file = os.path.abspath(file) if file else None

    def source(name: str) -> str:
        given = ("env", name) in loaded.override_sources or ("env",) in loaded.override_sources
        return "set" if given or spec_file is None else "file"

    return {"cwd": os.getcwd(), "spec_file": spec_file,
            "secrets": {name: source(name) for name, value in sorted(loaded.spec.env.items()) if is_secret(name, value)}}


def rerun_spec(rec: JobRecord, overrides: list[str],
               values: list[tuple[tuple[str, ...], object, str]] = ()) -> LoadedSpec:  # type: ignore[assignment]
    """The recorded spec of ``rec`` with its secret values read again, ``values`` (``--env-file``,
    ``--env``: ``load_spec``'s) set over it and ``overrides`` applied.

    Raises:
        SpecError: a secret value that cannot be read again (each named, with how to give it), or
            what the overrides make wrong.
    """
    from launcher.core.errors import Issue, SpecError
    from launcher.spec.defaults import layers
    from launcher.spec.load import load_spec, parse_override
    from launcher.spec.secrets import shown_url

    origin = rec.origin or {}
    spec_file = _text(origin.get("spec_file"))
    sources = {str(k): str(v) for k, v in _mapping(origin.get("secrets")).items()}
    env = _mapping(rec.spec.get("env"))
    given = {parse_override(o)[0] for o in overrides} | {tuple(path) for path, _, _ in values}
    masked = [n for n, v in env.items() if v == MASK and (n in sources or is_secret(n))]
    missing: list[Issue] = []
    from_file = _file_env(spec_file) if any(sources.get(n) == "file" for n in masked) else {}
    for name in masked:
        if ("env", name) in given or ("env",) in given:
            sources[name] = "set"
            continue
        value = from_file.get(name) if sources.get(name) == "file" else None
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            env[name] = str(value)
            continue
        missing.append(Issue(("env", name), _why_missing(sources.get(name), spec_file),
                             hint=f"give it again: ddpjob rerun {rec.id} --set env.{name}=VALUE, or --env-file FILE (or name it "
                             "in env_from_host, so the job takes it from your shell and ddpjob stores nothing)",
                             source=f"the recorded spec of {rec.id}"))
    notify = _mapping(rec.spec.get("notify"))
    masked_url = notify.get("url") if str(notify.get("url") or "").endswith("/***") else None
    if masked_url and not {("notify", "url"), ("notify",)} & given:
        # Read again where it can have come from: the spec file, the project file, the user config.
        places = [_file_spec(spec_file), *(layer.data for layer in layers())]
        urls = [n.get("url") for p in places if isinstance(n := p.get("notify"), dict)]
        notify["url"] = next((u for u in urls if isinstance(u, str) and shown_url(u) == masked_url), None)
        if notify["url"] is None:
            missing.append(Issue(("notify", "url"), f"the URL ({masked_url}) is not stored by ddpjob (a webhook's "
                                 "path is often its secret), and neither the spec file nor a defaults file holds "
                                 "it now", hint=f"give it again: ddpjob rerun {rec.id} --set notify.url=URL",
                                 source=f"the recorded spec of {rec.id}"))
    if missing:
        raise SpecError(None, missing)
    data = _without_defaults({**rec.spec, "env": env, **({"notify": notify} if notify else {})})
    loaded = load_spec(None, overrides=overrides, base=data, values=values)
    loaded.origin = {"cwd": origin.get("cwd") or os.getcwd(), "spec_file": spec_file,
                     "secrets": {n: sources.get(n, "set") for n, v in sorted(loaded.spec.env.items()) if is_secret(n, v)},
                     "rerun_of": rec.id}
    return loaded


def _without_defaults(data: dict[str, object]) -> dict[str, object]:
    """The recorded spec as its author wrote it, near enough: the registry records every field, and
    a default written out is not always the same as a field left out (``k8s.runtime`` is refused
    on a PyTorchJob when it is given). Fields equal to their default are left out again."""
    from launcher.spec.model import spec_model

    defaults = spec_model().model_validate({"name": "x", "command": ["x"]}).model_dump(mode="json")

    def strip(have: dict[str, object], default: dict[str, object]) -> dict[str, object]:
        out = {}
        for key, value in have.items():
            if key in default and value == default[key]:
                continue
            inner = default.get(key)
            out[key] = strip(value, inner) if isinstance(value, dict) and isinstance(inner, dict) else value
        return out

    return {**strip(data, defaults), "name": data["name"], "command": data["command"]}


def _mapping(value: object) -> dict[str, object]:
    """A mapping of the stored record (a copy; {} for anything else)."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _why_missing(source: str | None, spec_file: str | None) -> str:
    if source == "file" and spec_file:
        return (f"a secret value, not stored by ddpjob; it came from {spec_file}, which no longer holds it "
                "(moved, removed or changed)")
    if source == "set":
        return "a secret value, not stored by ddpjob; it was given on the command line (--set) or standard input"
    return "a secret value, not stored by ddpjob, and where it came from was not recorded"


def _file_env(path: str | None) -> dict[str, object]:
    """The ``env`` mapping of the spec file at ``path`` as it is now ({} when it cannot be read)."""
    return _mapping(_file_spec(path).get("env"))


def _file_spec(path: str | None) -> dict[str, object]:
    """The spec file at ``path`` as it is now, as plain data ({} when it cannot be read)."""
    if not path:
        return {}
    from launcher.core.errors import SpecError
    from launcher.spec import yamlread

    try:
        data, _, issues = yamlread.parse(yamlread.read_spec_text(path), path)
    except (SpecError, OSError):
        return {}
    return data if isinstance(data, dict) and not issues else {}

