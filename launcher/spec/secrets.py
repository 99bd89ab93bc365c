"""Secret values in a spec's ``env``: shown as ``***`` wherever ddpjob prints or records a spec or plan.

A variable is secret when its name matches one of ``SECRET_PATTERNS`` (case-insensitive globs:
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*PASSWD*``, ``*_KEY``, ``*CREDENTIAL*``) or one of
the globs in ``$DDPJOB_SECRET_ENV`` (comma- or space-separated; they add to the defaults), or when
its value is a credential by its shape, whatever its name (``launcher.core.tokens``: a GitHub or
Hugging Face token, a private key, a URL with a password, ...). The job
itself still receives the value. To keep a value out of ddpjob's files altogether, name it in
``env_from_host:`` instead: the job then takes it from the submitting shell's environment.

A plan shown to people (``render``, ``submit --dry-run``, the run directory's ``plan.txt``) is
the target's render of the very payload it submits, with the values of ``secret_names`` masked,
so its layout is exactly the real one.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping

from launcher.core.tokens import MASK, Marks, kind_of, mask_shapes

__all__ = ["MASK", "Marks", "is_secret", "kind_of", "marks_of", "mask_env", "mask_spec", "secret_names"]

SECRET_PATTERNS = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*_KEY", "*CREDENTIAL*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SET_ENV = re.compile(r"^(\s*env\s*\.\s*)([^=]*?)(\s*=)(.*)$", re.DOTALL)


def patterns() -> tuple[str, ...]:
    """The default globs plus those in ``$DDPJOB_SECRET_ENV``."""
    extra = [p.upper() for p in re.split(r"[,\s]+", os.environ.get("DDPJOB_SECRET_ENV", "")) if p]
    return SECRET_PATTERNS + tuple(extra)


def is_secret(name: str, value: object = None) -> bool:
    """Whether the value of variable ``name`` is masked when shown: by its name, or by ``value``'s
    own shape when it is given (``launcher.core.tokens.kind_of``)."""
    upper = str(name).upper()
    if any(fnmatch.fnmatchcase(upper, p) for p in patterns()):
        return True
    return isinstance(value, str) and value != MASK and kind_of(value) is not None


def why_secret(name: str, value: object = None) -> str:
    """``looks secret`` (by its name), or what its value is (``holds a GitHub token``)."""
    kind = kind_of(value) if isinstance(value, str) and not is_secret(name) else None
    return f"holds {'an' if kind[0] in 'AEIOU' else 'a'} {kind}" if kind else "looks secret"


def secret_names(env: Mapping[str, object]) -> frozenset[str]:
    """The names in ``env`` whose values are masked when shown."""
    return frozenset(k for k, v in env.items() if is_secret(k, v))


def marks_of(env: Mapping[str, object], host: dict[str, str] | None = None) -> Marks | None:
    """The marks (``launcher.core.tokens.Marks``) of the secret values in ``env`` and of the
    ``env_from_host`` values in ``host`` that are secret by name or shape: how ddpjob finds them
    again in what a job prints without keeping them."""
    values = [str(v) for k, v in {**env, **(host or {})}.items() if is_secret(k, v) and str(v) != MASK]
    return Marks.of(values)


def shown_value(name: str, value: str, masked: frozenset[str]) -> str:
    """``value`` as a plan's text shows it: ``***`` when ``name`` is in ``masked``."""
    return MASK if name in masked else value


def mask_env(env: Mapping[str, object]) -> dict[str, object]:
    """``env`` with the values of secret names (or shapes) replaced by ``***``."""
    return {k: (MASK if is_secret(k, v) else v) for k, v in env.items()}


def mask_spec(data: dict[str, object]) -> dict[str, object]:
    """A spec as JSON data (the registry's copy) with secret env values and the path of a notify
    URL masked."""
    notify = data.get("notify") if isinstance(data, dict) else None
    if isinstance(notify, dict) and isinstance(notify.get("url"), str):
        data = {**data, "notify": {**notify, "url": shown_url(notify["url"])}}
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or not any(is_secret(k, v) for k, v in env.items()):
        return data
    return {**data, "env": mask_env(env)}


def shown_url(url: str) -> str:
    """``https://hooks.example.com/***``: where a URL goes, never its path, query or credentials
    (a webhook's path is often its secret)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL at all (e.g. "http://[::1/x"): nothing of it is shown
        return MASK
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/***"


def mask_override(text: str) -> str:
    """``env.API_TOKEN=abc`` -> ``env.API_TOKEN=***`` (how a ``--set`` is shown in messages); a
    whole ``env={...}`` naming a secret variable is shown as ``env=***``; ``notify.url=URL`` as
    ``notify.url=https://host/***`` and a whole ``notify={...}`` with a URL as ``notify=***``."""
    m = _SET_ENV.match(text)
    if m and is_secret(m.group(2).strip(), m.group(4).strip().strip("'\"")):
        return f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}"
    key, sep, value = text.partition("=")
    if sep and key.strip() == "env" and (any(is_secret(w) for w in _WORD.findall(value)) or kind_of(value)):
        return f"{key}={MASK}"
    if sep and key.strip() == "notify.url":
        return f"{key}={shown_url(value.strip())}"
    if sep and key.strip() == "notify" and "url" in value:
        return f"{key}={MASK}"
    return mask_shapes(text)


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``), for one-line messages."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def host_env_note(names: list[str]) -> str:
    """The plan's line for ``env_from_host``: names only, never values."""
    return (f"# env_from_host: {', '.join(names)} (each process takes the value of the submitting shell at "
            "submit; ddpjob stores no value)\n")


