"""The plan people see: secret values masked and ``env_from_host`` names listed, and the checks of
``env_from_host`` against the target and the submitting shell (``launcher.spec.secrets`` decides
what is secret)."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from launcher.spec.secrets import host_env_note, is_secret, mask_env

if TYPE_CHECKING:
    from launcher.spec.load import LoadedSpec
    from launcher.targets.base import AnyTarget, Plan, PlanContext


def shown_plan(target: AnyTarget, loaded: LoadedSpec, ctx: PlanContext, plan: Plan[Any]) -> Plan[Any]:
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


def host_env_issues(target: AnyTarget, loaded: LoadedSpec, *, submitting: bool) -> list[Any]:
    """Why ``env_from_host`` cannot be honoured: a target that would have to store the values, or
    (at submit) a name the submitting shell does not set. Returns spec ``Issue``s."""
    from launcher.core.errors import Issue
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
