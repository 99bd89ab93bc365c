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
              help="Show what goes into the image (with sizes), what is left out and why, what the scan for "
              "secrets found and which files it did not read; build and push nothing (no engine or registry needed).")
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

    What goes in is also scanned for secrets by content (private keys, cloud keys, tokens of
    GitHub, GitLab, Slack, npm, PyPI, Hugging Face, W&B, kubeconfig and login credentials, other
    ddpjob specs' secret env values). A finding stops the build (exit 2, as file:line kind and the
    value's first 4 characters) until the file is left out in .ddpjobignore or accepted: '#
    ddpjob: allow-secret' on the line, or build.allow_secrets: [PATH or PATH:LINE]. Files over 10
    MiB and binary files are not scanned (said on stderr; --list names them).

    build.requirements (a requirements file in the context, or pyproject.toml) is installed with
    pip in a layer of its own that is rebuilt only when the requirements change.

    \b
    Examples:
      ddpjob build train.yaml --list          # what goes in, what is left out and why
      ddpjob build train.yaml --set build.registry=ghcr.io/me/train --env-file ~/wandb.env
      IMAGE=$(ddpjob build -q train.yaml) && kubectl set image ... "pytorch=$IMAGE"
    """
    import dataclasses

    from launcher.core.errors import SpecError
    from launcher.service.imagebuild import pin
    from launcher.service.imagebuild.context import human

    loaded = pin.with_build(load((spec_file,), overrides(sets, None, None, None)))
    try:
        if list_:
            prep, issues = pin.survey(loaded, registry_needed=False)
            for line in listing(prep, shown_tag=not issues):
                click.echo(line)
            if issues:
                raise loaded.error(issues)
            return
        prep = pin.prepare(loaded)
    except SpecError as e:  # build submits nothing in any case: it says what it did not do
        raise dataclasses.replace(e, ending="nothing was built or pushed") from None
    for line in (prep.left_out_line, prep.unscanned_line):
        if line:
            click.echo(line, err=True)
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
    out += _scan_lines(prep)
    if shown_tag:
        where = prep.tag_ref if prep.repository else f"{prep.tag} (no repository yet: build.registry)"
        out.append(f"tag {where}")
    return out


def _scan_lines(prep: Prepared) -> list[str]:
    """What the content scan found (each accepted one said so) and the files it did not read."""
    from launcher.service.imagebuild import secretfound
    from launcher.service.imagebuild.context import human

    ctx = prep.ctx
    if not ctx.scanned:
        return ["not scanned for secrets: the context is over build.max_context (nothing was read)"]
    open_ = set(secretfound.unaccepted(ctx.findings, prep.options.allow_secrets))
    out = [f"secrets found: {len(open_)}" + (f" (and {len(ctx.findings) - len(open_)} accepted)"
                                               if len(ctx.findings) > len(open_) else "")]
    width = max((len(f.where) for f in ctx.findings), default=0)
    for f in ctx.findings:
        out.append(f"  {f.where:<{width}}  {f.kind} {f.masked}" + ("" if f in open_ else "  (accepted: build.allow_secrets)"))
    sizes = {e.rel: e.size for e in ctx.entries}
    out.append(f"not scanned for secrets: {len(ctx.unscanned)}")
    out += [f"  {human(sizes.get(rel, 0)):>10}  {rel}  {why}" for rel, why in ctx.unscanned]
    return out


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}" if n else ""
