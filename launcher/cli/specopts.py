"""The command line's spec options (``--target``, ``--nodes``, ``--set`` ...) and how they turn into
a loaded spec. Imports only click and the target names at start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from launcher.targets import TARGET_NAMES  # names only: no target is imported here

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs
    from launcher.spec.load import LoadedSpec

TARGET_CHOICE = click.Choice(TARGET_NAMES)


def spec_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for deco in reversed([
        click.option("--target", "-t", type=TARGET_CHOICE, default="local", show_default=True, help="Where to run."),
        click.option("--nodes", "-n", type=int, help="Override nodes."),
        click.option("--procs-per-node", "-p", help="Override procs_per_node (an integer or 'auto')."),
        click.option("--name", help="Override the job name."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Override any field, e.g. --set resources.cpus=4 --set env.SEED=1 (repeatable)."),
    ]):
        fn = deco(fn)
    return fn


def overrides(sets: tuple[str, ...], nodes: int | None, procs: str | None, name: str | None) -> list[str]:
    out = list(sets)
    if nodes is not None:
        out.append(f"nodes={nodes}")
    if procs is not None:
        out.append(f"procs_per_node={procs}")
    if name is not None:
        out.append(f"name={name}")
    return out


def load(args: tuple[str, ...], overrides: list[str]) -> LoadedSpec:
    """A spec file (``SPEC``) or a bare command (``-- python train.py ...``)."""
    from launcher.core.errors import UsageError
    from launcher.service import jobs

    if args and args[0].endswith((".yaml", ".yml")):
        if len(args) > 1:
            raise UsageError(f"extra arguments after the spec {args[0]}: {' '.join(args[1:])}; "
                             "put the command in the spec's command:, or use --set")
        return jobs.load(args[0], overrides=overrides)
    return jobs.load(None, command=list(args), overrides=overrides)


def jobs_service() -> Jobs:
    from launcher.service.jobs import Jobs

    return Jobs()
