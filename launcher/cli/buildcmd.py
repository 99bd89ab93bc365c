"""``ddpjob build``: build ``image`` + the working directory, push it and print the pinned reference
(``--build`` of submit and render is a spec option: ``launcher.cli.specopts``); ``--list`` shows
what would go in. Imports only click at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from launcher.cli.specopts import ENV_FILE_OPTION, load, overrides
from launcher.cli.support import guard

if TYPE_CHECKING:
    from launcher.service.imagebuild.pin import Prepared


@click.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any field, e.g. --set build.registry=ghcr.io/me/train (repeatable).")
@ENV_FILE_OPTION
@click.option("--list", "list_", is_flag=True,
              help="Show what goes into the image (with sizes) and what is left out and why; build and push "
              "nothing (no engine or registry needed).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the reference.")
@guard
def build(spec_file: str, sets: tuple[str, ...], list_: bool, quiet: bool) -> None:
    """Build the spec's image + working directory, push it, print the pinned repo@sha256:... reference.

    The tag is a hash of the base image, the Dockerfile and the files that go in: when the
    registry has it already, nothing is built or pushed. The registry is reached through podman or
    docker and their own login (podman login REGISTRY); ddpjob stores no credentials. `submit
    --target k8s` does the same before it creates the job, so this command is for scripts and for
    building ahead.

    What goes in: the context (build.context, default the working directory) less what
    .ddpjobignore (else .dockerignore; else .git, .venv and caches) leaves out, and less
    secret-looking files even where the ignore file does not name them: env files (.env, .env.*,
    *.env), the --env-file files, private keys (id_rsa, *.pem, *.key, *.p12, .ssh/), cloud,
    cluster and registry logins (.aws/, .config/gcloud/, .kube/, .docker/config.json, .netrc,
    .pypirc ...). One line on stderr names them; a '!' line in the ignore file naming the path
    takes one back (!certs/ca.pem). A spec file that goes in holding a secret env value is refused
    (exit 2): give the value with env_from_host or an --env-file outside the context.

    build.requirements (a requirements file in the context, or pyproject.toml) is installed with
    pip in a layer of its own that is rebuilt only when the requirements change.

    \b
    Examples:
      ddpjob build train.yaml --list          # what goes in, what is left out and why
      ddpjob build train.yaml --set build.registry=ghcr.io/me/train --env-file ~/wandb.env
      IMAGE=$(ddpjob build -q train.yaml) && kubectl set image ... "pytorch=$IMAGE"
    """
    from launcher.service.imagebuild import pin
    from launcher.service.imagebuild.context import human

    loaded = pin.with_build(load((spec_file,), overrides(sets, None, None, None)))
    if list_:
        prep, issues = pin.survey(loaded, registry_needed=False)
        for line in listing(prep, shown_tag=not issues):
            click.echo(line)
        if issues:
            raise loaded.error(issues)
        return
    prep = pin.prepare(loaded)
    if prep.left_out_line:
        click.echo(prep.left_out_line, err=True)
    if not quiet:
        click.echo(f"context {prep.root}: {len(prep.ctx.entries)} entries, {human(prep.ctx.size)} "
                   f"({prep.ctx.ignore_file or 'default ignores'}); tag {prep.tag_ref}", err=True)
    done = pin.pinned(prep, build=True)
    if not quiet:
        click.echo("built and pushed" if done.built else "found in the registry: nothing built or pushed", err=True)
    click.echo(done.ref)


def listing(prep: Prepared, *, shown_tag: bool) -> list[str]:
    """``build --list``'s lines: the files and links that go in with their sizes, what is left out
    and why, and the tag (when the build could be made)."""
    from launcher.service.imagebuild.context import human

    ctx = prep.ctx
    files = [e for e in ctx.entries if e.kind != "d"]
    counts = [_count(sum(e.kind == k for e in ctx.entries), word) for k, word in (("f", "file"), ("l", "link"),
                                                                                   ("d", "folder"))]
    out = [f"context {ctx.root} (rules: {ctx.ignore_file or 'the default ignores'}, and the secret-looking defaults)",
           f"in the image at {prep.options.image_workdir}: {', '.join(c for c in counts if c)}, {human(ctx.size)}"]
    for e in files:
        out.append(f"  {human(e.size):>10}  {e.rel}" if e.kind == "f" else f"  {'link':>10}  {e.rel} -> {e.digest}")
    out.append(f"left out: {len(ctx.left_out)}")
    width = max((len(o.shown) for o in ctx.left_out), default=0)
    for o in ctx.left_out:
        size = human(o.size) if o.kind == "f" else ""
        out.append(f"  {size:>10}  {o.shown:<{width}}  {o.why}")
    if prep.left_out_line:
        out.append(prep.left_out_line)
    if shown_tag:
        where = prep.tag_ref if prep.repository else f"{prep.tag} (no repository yet: build.registry)"
        out.append(f"tag {where}")
    return out


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}" if n else ""
