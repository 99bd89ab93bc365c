"""Secret values in a spec's ``env``: shown as ``***`` wherever ddpjob prints or records a spec or plan.

A variable is secret when its name matches one of ``SECRET_PATTERNS`` (case-insensitive globs:
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*PASSWD*``, ``*_KEY``, ``*CREDENTIAL*``) or one of
the globs in ``$DDPJOB_SECRET_ENV`` (comma- or space-separated; they add to the defaults). The job
itself still receives the value. To keep a value out of ddpjob's files altogether, name it in
``env_from_host:`` instead: the job then takes it from the submitting shell's environment.

A plan shown to people (``render``, ``submit --dry-run``, the run directory's ``plan.txt``) is
the same plan made from the spec with those values masked, so its layout is exactly the real one.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.specload import LoadedSpec
    from launcher.targets.base import Plan, PlanContext, Target

MASK = "***"
SECRET_PATTERNS = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*_KEY", "*CREDENTIAL*")
_SET_ENV = re.compile(r"^(\s*env\s*\.\s*)([^=]*?)(\s*=)(.*)$", re.DOTALL)


def patterns() -> tuple[str, ...]:
    """The default globs plus those in ``$DDPJOB_SECRET_ENV``."""
    extra = [p.upper() for p in re.split(r"[,\s]+", os.environ.get("DDPJOB_SECRET_ENV", "")) if p]
    return SECRET_PATTERNS + tuple(extra)


def is_secret(name: str) -> bool:
    """Whether the value of variable ``name`` is masked when shown."""
    upper = str(name).upper()
    return any(fnmatch.fnmatchcase(upper, p) for p in patterns())


def mask_env(env: dict[str, Any]) -> dict[str, Any]:
    """``env`` with the values of secret names replaced by ``***``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def mask_spec(data: dict[str, Any]) -> dict[str, Any]:
    """A spec as JSON data (the registry's copy) with secret env values masked."""
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or not any(is_secret(k) for k in env):
        return data
    return {**data, "env": mask_env(env)}


def mask_override(text: str) -> str:
    """``env.API_TOKEN=abc`` -> ``env.API_TOKEN=***`` (how a ``--set`` is shown in messages)."""
    m = _SET_ENV.match(text)
    if m and is_secret(m.group(2).strip()):
        return f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}"
    return text


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``), for one-line messages."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def host_env_note(names: list[str]) -> str:
    """The plan's line for ``env_from_host``: names only, never values."""
    return (f"# env_from_host: {', '.join(names)} (each process takes the value of the submitting shell at "
            "submit; ddpjob stores no value)\n")


def shown_plan(target: Target, loaded: LoadedSpec, ctx: PlanContext, plan: Plan) -> Plan:
    """``plan`` with the text people see: secret values masked, ``env_from_host`` names listed.

    The payload (what is submitted) keeps the real values. The text is the target's own render of
    the same spec and context with the values masked, so it keeps the real layout and quoting.
    """
    spec = loaded.spec
    if not any(is_secret(k) for k in spec.env) and not spec.env_from_host:
        return plan
    text = plan.text
    if any(is_secret(k) for k in spec.env):
        masked = dataclasses.replace(loaded, spec=spec.model_copy(update={"env": mask_env(spec.env)}))
        text = target.plan(masked, ctx).text
    if spec.env_from_host:
        text += host_env_note(list(spec.env_from_host))
    return dataclasses.replace(plan, text=text)


def host_env_issues(target: Target, loaded: LoadedSpec, *, submitting: bool) -> list[Any]:
    """Why ``env_from_host`` cannot be honoured: a target that would have to store the values, or
    (at submit) a name the submitting shell does not set. Returns spec ``Issue``s."""
    from launcher.errors import Issue
    from launcher.targets import options_model

    names = list(loaded.spec.env_from_host)
    if not names:
        return []
    if not target.passes_host_env:
        refs = [f"{target.name}.{f}" for f in options_model(target.name).model_fields if f.startswith("env_")]
        return [Issue(("env_from_host",), f"the {target.name} target cannot take values from the submitting shell "
                      "without storing them", hint="keep the value in the scheduler and refer to it"
                      + (f": {' or '.join(refs)}" if refs else ""))]
    missing = [n for n in names if n not in os.environ] if submitting else []
    if missing:
        return [Issue(("env_from_host",), f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set in "
                      "this shell", hint=f"export {missing[0]}=... before submitting")]
    return []
