"""``ddpjob build``: build ``image`` + the working directory, push it and print the pinned reference
(``--build`` of submit and render is a spec option: ``launcher.cli.specopts``). Imports only click at
start-up."""

from __future__ import annotations

import click

from launcher.cli.specopts import load, overrides
from launcher.cli.support import guard


@click.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any field, e.g. --set build.registry=ghcr.io/me/train (repeatable).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the reference.")
@guard
def build(spec_file: str, sets: tuple[str, ...], quiet: bool) -> None:
    """Build the spec's image + working directory, push it, print the pinned repo@sha256:... reference.

    The tag is a hash of the base image, the Dockerfile and the context's files (after
    .ddpjobignore or .dockerignore): when the registry has it already, nothing is built or pushed.
    The registry is reached through podman or docker and their own login (podman login
    REGISTRY); ddpjob stores no credentials. `submit --target k8s` does the same before it
    creates the job, so this command is for scripts and for building ahead.

    \b
    Examples:
      ddpjob build train.yaml --set build.registry=ghcr.io/me/train
      IMAGE=$(ddpjob build -q train.yaml) && kubectl set image ... "pytorch=$IMAGE"
    """
    from launcher.service.imagebuild import pin
    from launcher.service.imagebuild.context import human

    loaded = pin.with_build(load((spec_file,), overrides(sets, None, None, None)))
    prep = pin.prepare(loaded)
    if not quiet:
        click.echo(f"context {prep.root}: {len(prep.ctx.entries)} entries, {human(prep.ctx.size)} "
                   f"({prep.ctx.ignore_file or 'default ignores'}); tag {prep.tag_ref}", err=True)
    done = pin.pinned(prep, build=True)
    if not quiet:
        click.echo("built and pushed" if done.built else "found in the registry: nothing built or pushed", err=True)
    click.echo(done.ref)
