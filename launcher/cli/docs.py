"""``ddpjob docs``: the reference pages, for a ddpjob installed without a clone. The pages are
``docs/*.md`` in a clone and ship inside the package as ``launcher/docs`` (a link to ``docs/``,
as ``jobs/`` is one to ``launcher/examples/``). ``PAGES`` lists them for ``ddpjob --help``'s
epilogue and for ``docs`` itself; a test keeps it equal to the files. ``LINKED`` lists the files the
pages link to and messages name (``k8s/rbac.yaml``...): they ship too, at the paths the pages' relative
links expect (``launcher/k8s`` is a link to ``k8s/`` as ``launcher/docs`` is to ``docs/``), so a pip
user's copy has no dead link and ``ddpjob docs k8s/rbac.yaml`` prints what a message says to apply.
A target installed from another package (``launcher.core.plugins``) brings its own page, printed by
``ddpjob docs <its name>``. Imports only click and the plugins' names."""

from __future__ import annotations

import os
import sys

import click

from launcher.cli.support import guard
from launcher.core.plugins import BUILTIN, target_names

# (topic, what the page holds): docs/<topic>.md, in the order the README's table gives them.
PAGES = (
    ("spec", "the job spec: defaults from files, notifications, env files, limits, secrets"),
    ("commands", "every command and option, a starting job's stages, exit codes, the Python API"),
    ("targets", "local (and in containers), Slurm, Kubernetes (PyTorchJob, TrainJob), your own"),
    ("build", "build: your code into an image, pinned by digest; the training image"),
    ("trainer", "the reference trainer, results and plots, the metrics file"),
    ("troubleshooting", "ports, NCCL, restarts, reading status, exit code 3"),
    ("performance", "every benchmark and its figures, with machine and versions"),
    ("developing", "tests, layout, static checks, golden files, torch quirks"),
)
TOPICS = tuple(topic for topic, _ in PAGES)
# (file, what it holds): launcher/<file>, named as the pages' links and the messages name it.
LINKED = (
    ("k8s/README.md", "Kubernetes in detail: installing the operator or Trainer v2, RBAC, what is rendered"),
    ("k8s/rbac.yaml", "the Role and RoleBinding ddpjob's users need in a namespace: edit, kubectl apply"),
    ("slurm/TARGET.md", "Slurm in detail: every slurm: option, containers, requeue, the job's files"),
    ("slurm/README.md", "a private 3-node Slurm on one machine to try the target (its script runs in a clone)"),
    ("docker/README.md", "the training image: its build (from a clone), its arguments, image: per target"),
    ("ARCHITECTURE.md", "how ddpjob is put together: packages, one skeleton per target, adding one"),
)




def plugin_targets() -> tuple[str, ...]:
    """The targets installed from other packages (their pages are ``ddpjob docs <name>``)."""
    return tuple(name for name in target_names() if name not in BUILTIN)


def folder() -> str:
    """Where the installed pages are: ``launcher/docs`` beside this package."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def pages_help() -> str:
    """The epilogue's list of pages for ``ddpjob --help``."""
    rows = "\n".join(f"  {topic:<17}{what}" for topic, what in PAGES)
    return f"\b\nDocumentation: ddpjob docs TOPIC prints a page (ddpjob docs lists them):\n{rows}"


@click.command()
@click.argument("topic", required=False, type=click.Choice(TOPICS + tuple(f for f, _ in LINKED) + plugin_targets()), metavar="[TOPIC]")
@click.option("--path", "path_only", is_flag=True, help="Print the page's file (or, without TOPIC, the folder) instead.")
@guard
def docs(topic: str | None, path_only: bool) -> None:
    """Show ddpjob's reference pages (Markdown), installed with ddpjob: no clone needed.

    Without TOPIC, list the pages and where they are; with TOPIC, print that page (through a pager
    on a terminal). TOPIC may also be a file the pages link to, as they name it (k8s/rbac.yaml), or
    a target installed from another package (its own page).

    \b
    Examples:
      ddpjob docs                  # the pages
      ddpjob docs targets          # local, Slurm, Kubernetes
      ddpjob docs trainer --path   # the file, to open in an editor or a Markdown viewer
      ddpjob docs k8s/rbac.yaml    # the RBAC a namespace admin applies
    """
    where = folder()
    if topic is None:
        if path_only:
            click.echo(where)
            return
        for name, what in PAGES:
            click.echo(f"{name:<18}{what}")
        click.echo("\nLinked from the pages (ddpjob docs FILE prints one too):")
        for name, what in LINKED:
            click.echo(f"{name:<18}{what}")
        if plugin_targets():
            click.echo("\nTargets installed from other packages (ddpjob docs NAME prints the page each brings):")
            for name in plugin_targets():
                click.echo(f"{name:<18}{_summary(name)}")
        click.echo(f"\nddpjob docs TOPIC prints one; the files: {where}/TOPIC.md, "
                   f"{os.path.dirname(where)}/FILE")
        return
    if topic in plugin_targets():
        page = _plugin_page(topic)
    else:
        page = os.path.join(where, f"{topic}.md") if topic in TOPICS else os.path.join(os.path.dirname(where), topic)
    if path_only:
        click.echo(page)
        return
    try:
        with open(page, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        click.echo(f"ddpjob: error: cannot read the page {topic}: {page}: {e.strerror} (this installation "
                   "lacks its docs; reinstall ddpjob)", err=True)
        sys.exit(3)
    if sys.stdout.isatty():
        click.echo_via_pager(text)
    else:
        click.echo(text, nl=False)


def _summary(name: str) -> str:
    from launcher.core.plugins import PluginError, plugin, registered

    try:
        return f"{plugin(name).summary} ({registered()[name].distribution})"
    except PluginError as e:
        return f"cannot be loaded: {e}"


def _plugin_page(name: str) -> str:
    """The page target ``name``'s plugin brings; exits 3 saying why when there is none."""
    from launcher.core.plugins import PluginError, docs_page, registered

    try:
        page = docs_page(name)
    except PluginError as e:
        click.echo(f"ddpjob: error: {e}", err=True)
        sys.exit(3)
    if page is None:
        click.echo(f"ddpjob: error: the {name} target (from the {registered()[name].distribution} package) brings no "
                   "page; see that package's own documentation", err=True)
        sys.exit(3)
    return page
