"""The command line's spec options (``--target``, ``--nodes``, ``--set`` ...) and how they turn into
a loaded spec. Imports only click and the target names at start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import click

from launcher.core.plugins import target_names  # names only: no target is imported here

if TYPE_CHECKING:
    from launcher.core.errors import SpecError
    from launcher.service.jobs import Jobs
    from launcher.spec.load import LoadedSpec

TARGET_CHOICE = click.Choice(target_names(), case_sensitive=False)


P = ParamSpec("P")
R = TypeVar("R")


def spec_options(fn: Callable[P, R]) -> Callable[P, R]:
    for deco in reversed([
        click.option("--target", "-t", type=TARGET_CHOICE, help="Where to run [default: the project file's or user "
                     "config's target, else local: see ddpjob config show]."),
        click.option("--nodes", "-n", type=int, help="Override nodes."),
        click.option("--procs-per-node", "-p", help="Override procs_per_node (an integer or 'auto')."),
        click.option("--name", help="Override the job name."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Override any field, e.g. --set resources.cpus=4 --set env.SEED=1 (repeatable)."),
        ENV_FILE_OPTION,
        ENV_OPTION,
        click.option("--notify", metavar="CMD", expose_value=False, callback=_keep,
                     help="Run CMD once the job ends (split like a shell line, run without one; "
                     "DDPJOB_JOB_ID, DDPJOB_STATE, DDPJOB_MESSAGE in its environment): notify.command."),
        click.option("--notify-url", metavar="URL", expose_value=False, callback=_keep,
                     help="POST the job's id, state and root cause as JSON to URL once it ends: notify.url."),


        click.option("--build", is_flag=True, expose_value=False, callback=_keep_build,
                     help="Build image + the working directory (the spec's build: section, or its defaults), push "
                     "it and run on its digest; unchanged files are not rebuilt. render only looks it up."),
    ]):
        fn = deco(fn)
    return fn


def _keep(ctx: click.Context, param: click.Parameter, value: tuple[str, ...] | str | None) -> None:
    """``--env-file``, ``--env``, ``--notify``, ``--notify-url``: kept for ``load`` (they reach no
    command's signature)."""
    ctx.meta[f"ddpjob.{param.name}"] = value


ENV_OPTION = click.option("--env", multiple=True, metavar="NAME=VALUE", expose_value=False, callback=_keep,
                          help="Set one env variable, its value taken as written (repeatable; wins over --env-file).")
ENV_FILE_OPTION = click.option("--env-file", multiple=True, metavar="FILE", expose_value=False, callback=_keep,
                               help="Set env variables from a dotenv file (NAME=value lines; repeatable). A build "
                               "leaves the file out of the image.")


def _values(ctx: click.Context) -> list[tuple[tuple[str, ...], object, str]]:
    """(field path, value, source) of ``--env-file`` (in order), ``--env`` (a later one wins),
    ``--notify`` and ``--notify-url``: values taken as given, never parsed as YAML."""
    from launcher.spec.defaults import env_pair, notify_values, read_env_file

    pairs = [pair for path in ctx.meta.get("ddpjob.env_file", ()) for pair in read_env_file(path)]
    pairs += [env_pair(text) for text in ctx.meta.get("ddpjob.env", ())]
    return [(("env", name), value, src) for name, value, src in pairs] + notify_values(
        ctx.meta.get("ddpjob.notify"), ctx.meta.get("ddpjob.notify_url"))


def resolve_target(target: str | None, loaded: LoadedSpec) -> str:
    """The target: ``--target``, else the project file's or user config's, else local."""
    return loaded.chosen_target(target)


BUILD_KEY = "ddpjob.build"


def _keep_build(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta[BUILD_KEY] = value


def overrides(sets: tuple[str, ...], nodes: int | None, procs: str | None, name: str | None) -> list[str]:
    out = list(sets)
    if nodes is not None:  # named as typed in messages (launcher.spec.load.FLAG_FIELDS)
        out.append(f"--nodes={nodes}")
    if procs is not None:
        out.append(f"--procs-per-node={procs}")
    if name is not None:
        out.append(f"--name={name}")
    return out


class CommandAfterDashes(click.Command):
    """A command whose ``--`` starts a program to run: what follows it is kept apart from the
    arguments before it (click would merge them), so ``submit`` knows what the user typed
    instead of guessing from a file name."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[COMMAND_KEY] = tuple(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta[COMMAND_KEY] = None
        # `--dry-run SPEC`: the option's value is optional (client, server); anything else after it
        # is the next argument, as a user who writes `submit --dry-run spec.yaml` means.
        args = [f"{a}=client" if a == "--dry-run" and (i + 1 == len(args) or args[i + 1] not in ("client", "server"))
                else a for i, a in enumerate(args)]
        return super().parse_args(ctx, args)


COMMAND_KEY = "ddpjob.command"


def typed_command() -> tuple[str, ...] | None:
    """The words after ``--`` of the command being run (None: there was no ``--``)."""
    command: tuple[str, ...] | None = click.get_current_context().meta.get(COMMAND_KEY)
    return command


def load(args: tuple[str, ...], overrides: list[str], command: tuple[str, ...] | None = None, *,
         command_hint: bool = False) -> LoadedSpec:
    """A spec file (``SPEC``; ``-`` reads it from standard input) or a command typed after ``--``,
    with the ``--env-file`` paths it read and a ``build:`` section when ``--build`` was given.

    What the user typed decides, never a file's name: without ``--`` every argument is a spec."""
    loaded = with_env_files(_load(args, overrides, command, command_hint=command_hint))
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(BUILD_KEY):
        from launcher.service.imagebuild.pin import with_build

        loaded = with_build(loaded)
    return loaded


def with_env_files(loaded: LoadedSpec) -> LoadedSpec:
    """``loaded`` knowing the ``--env-file`` paths it read (a build leaves them out of the image)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or not ctx.meta.get("ddpjob.env_file"):
        return loaded
    import dataclasses
    import os

    return dataclasses.replace(loaded, env_files=tuple(os.path.abspath(p) for p in ctx.meta["ddpjob.env_file"]))


def given_values() -> list[tuple[tuple[str, ...], object, str]]:
    """The current command's ``--env-file``, ``--env``, ``--notify`` and ``--notify-url`` values
    (``load_spec``'s ``values``)."""
    return _values(click.get_current_context())


def _load(args: tuple[str, ...], overrides: list[str], command: tuple[str, ...] | None, *,
          command_hint: bool) -> LoadedSpec:
    from launcher.core.errors import Issue, SpecError, UsageError
    from launcher.service import jobs

    values = _values(click.get_current_context())
    if command is not None:
        if args:
            raise UsageError(f"a spec ({args[0]}) and a command after -- ({' '.join(command)}): give one of them; "
                             "put the command in the spec's command:, or use --set")
        return jobs.load(None, command=list(command), overrides=overrides, values=values)
    if len(args) > 1 and (args[0].lower().endswith((".yaml", ".yml")) or args[0] == "-"):
        raise UsageError(f"extra arguments after the spec {args[0]}: {' '.join(args[1:])}; "
                         "put the command in the spec's command:, or use --set")
    if len(args) > 1:
        raise UsageError(f"{' '.join(args)}: one spec file at most; to run a command, put -- before it: "
                         f"ddpjob submit [OPTIONS] -- {' '.join(args)}")
    if not args:
        return jobs.load(None, command=[], overrides=overrides, values=values)  # says what to give
    if args[0] == "-":
        from launcher.spec.load import STDIN_NAME, read_stdin_text

        return jobs.load(STDIN_NAME, overrides=overrides, text=read_stdin_text(), values=values)
    try:
        return jobs.load(args[0], overrides=overrides, values=values)
    except SpecError as e:
        hint = _not_a_spec_hint(args[0], e, command_hint)
        if hint is None:
            raise
        issue = e.issues[0]
        raise SpecError(e.file, [Issue(issue.path, issue.message, hint, issue.source)], e.locations) from e


def _not_a_spec_hint(path: str, e: SpecError, command_hint: bool) -> str | None:
    """A better hint when what was given is not a spec at all: a pipe, or a program meant to run."""
    if len(e.issues) != 1 or e.issues[0].path or e.issues[0].source:
        return None
    message = e.issues[0].message
    if message.startswith(("not a regular file (a FIFO", "not a regular file (a character")):
        return "to read a spec from standard input, give - (ddpjob validate - < spec.yaml)"
    program = path.endswith(".py") or message.startswith(("the spec must be a mapping", "YAML syntax error"))
    if command_hint and program and not path.lower().endswith((".yaml", ".yml")):
        return f"a spec is a YAML file; to run a program, put -- before it: ddpjob submit [OPTIONS] -- python {path}"
    return None


def jobs_service() -> Jobs:
    from launcher.service.jobs import Jobs

    return Jobs()
