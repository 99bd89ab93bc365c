"""Sweeps and placeholders: a job's runs (the grid of ``sweep:``), ``{name}`` substituted in
``command``, ``env`` and ``output_dir``, and the check that every placeholder is known. Apart from
``model.py`` (the spec's fields), which stays small."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core.errors import Issue
from launcher.spec.model import BUILTIN_PLACEHOLDERS, PLACEHOLDER_RE, format_value
from launcher.spec.secrets import is_secret

if TYPE_CHECKING:
    import re

    from launcher.spec.model import JobSpecBase


def check_placeholders(spec: JobSpecBase) -> list[Issue]:
    """Every ``{name}`` must be a sweep parameter or a built-in, and every sweep parameter used."""
    known = set(spec.sweep) | set(BUILTIN_PLACEHOLDERS)
    used: set[str] = set()
    issues: list[Issue] = []
    fields: list[tuple[tuple[str | int, ...], str]] = [(("command", i), a) for i, a in enumerate(spec.command)]
    fields += [(("env", k), v) for k, v in spec.env.items()]
    for path, text in fields:
        for name in placeholders(text):
            used.add(name)
            if name not in known:
                shown = "a placeholder {...}" if path[0] == "env" and is_secret(str(path[1])) else f"placeholder {{{name}}}"
                issues.append(
                    Issue(
                        path,
                        f"{shown} is not a sweep parameter or one of {list(BUILTIN_PLACEHOLDERS)}",
                        hint=(f"sweep defines {sorted(spec.sweep)}; " if spec.sweep else "")
                        + "write {{ and }} for literal braces",
                    )
                )
    if spec.output_dir is not None:
        for name in placeholders(spec.output_dir):
            if name != "job_id":
                issues.append(Issue(("output_dir",), f"placeholder {{{name}}} cannot be used here",
                                    hint="output_dir may use {job_id}; each task of a sweep gets its own sub-folder (sweep-<index>)"))
    for key in spec.sweep:
        if key not in used:
            issues.append(
                Issue(("sweep", key), f"sweep parameter {key!r} is not used", hint=f"add {{{key}}} to command or env")
            )
    return issues


def placeholders(text: str) -> list[str]:
    """Names of the ``{name}`` placeholders in ``text`` (``{{``/``}}`` are literal braces)."""
    return [m.group(1) for m in PLACEHOLDER_RE.finditer(text) if m.group(1) is not None]


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace ``{name}`` by ``values[name]``; ``{{``/``}}`` become literal braces. Never evaluates."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        return values[m.group(1)]

    return PLACEHOLDER_RE.sub(repl, text)


@dataclass(frozen=True)
class SweepElement:
    """One run of a job: the whole job when there is no sweep, else one point of the grid."""

    index: int
    params: dict[str, str]
    command: list[str]
    env: dict[str, str]
    output_dir: str


def expand(spec: JobSpecBase, *, job_id: str, output_root: str) -> list[SweepElement]:
    """The runs of a job, in a stable order (the cartesian product of ``sweep``, last key fastest).

    Each element gets its own output folder: ``output_root`` itself without a sweep, else
    ``output_root/sweep-<index>``.
    """
    keys = list(spec.sweep)
    combos = list(itertools.product(*(spec.sweep[k] for k in keys))) if keys else [()]
    output_root = substitute(output_root, {"job_id": job_id})  # output_dir may name {job_id}
    elements = []
    for index, combo in enumerate(combos):
        params = {k: format_value(v) for k, v in zip(keys, combo)}
        out = output_root if not keys else f"{output_root.rstrip('/')}/sweep-{index}"
        values = {**params, "job_id": job_id, "sweep_index": str(index), "output_dir": out}
        elements.append(
            SweepElement(
                index=index,
                params=params,
                command=[substitute(a, values) for a in spec.command],
                env={k: substitute(v, values) for k, v in spec.env.items()},
                output_dir=out,
            )
        )
    return elements
