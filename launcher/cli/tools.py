"""Commands around the jobs: shell completion, removing finished jobs, and ``doctor``. Imports only
click at start-up; each command imports what it needs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import click

from launcher.cli.formats import MACHINE, echo, output_option
from launcher.cli.specopts import TARGET_CHOICE
from launcher.cli.support import guard

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from launcher.service.jobs import Jobs

SHELLS = ("bash", "zsh", "fish")


def complete_job_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem[str]]:
    """Job ids for ID arguments, newest first, with their state as help (zsh and fish show it)."""
    from click.shell_completion import CompletionItem

    try:
        from launcher.service.jobs import Jobs

        records = Jobs().recorded(limit=200)
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []
    return [CompletionItem(r.id, help=r.state.value) for r in records if r.id.startswith(incomplete)]


def complete_examples(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem[str]]:
    """The names of the examples ``init`` writes, with what each is as help (zsh and fish show it)."""
    from click.shell_completion import CompletionItem

    from launcher.spec import examples as starters

    return [CompletionItem(n, help=starters.summary(starters.text(n))) for n in starters.names() if n.startswith(incomplete)]


def complete_spec_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem[str]]:
    """Spec files: the shell completes paths."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(incomplete, type="file")]


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script (commands, options, targets, spec files and job ids).

    \b
    Install:
      bash:  ddpjob completion bash > ~/.local/share/bash-completion/completions/ddpjob
      zsh:   ddpjob completion zsh > "${fpath[1]}/_ddpjob"
      fish:  ddpjob completion fish > ~/.config/fish/completions/ddpjob.fish
    Or for this shell only:  eval "$(ddpjob completion bash)"
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    # The root command (launcher.cli.main's group) from the context: this module never imports main.
    click.echo(cls(ctx.find_root().command, {}, "ddpjob", "_DDPJOB_COMPLETE").source())


@click.command()
@click.argument("job_ids", nargs=-1, required=True, metavar="ID...", shell_complete=complete_job_ids)
@click.option("--force", is_flag=True, help="Cancel a job that still runs, then remove it.")
@guard
def rm(job_ids: tuple[str, ...], force: bool) -> None:
    """Remove finished jobs: their records and run directories under $DDPJOB_HOME.

    Folders elsewhere (a Slurm job folder, an output_dir you chose) may hold your results: they are
    listed, never deleted.

    \b
    Examples:
      ddpjob rm quickstart-ab2cd
      ddpjob rm --force sweep-x7k2m     # cancel it first
    """
    from launcher.cli.show import size_text
    from launcher.service.cleanup import remove
    from launcher.service.jobs import Jobs

    jobs = Jobs()
    for job_id in job_ids:
        done = remove(jobs, job_id, force=force)
        click.echo(f"{done.job_id}: removed ({size_text(done.freed)} freed)")
        for path in done.kept:
            click.echo(f"  kept {path} (not under $DDPJOB_HOME: remove it yourself if you no longer need it)")


@click.command()
@click.option("--older-than", default="7d", show_default=True, help="Jobs that ended longer ago than this (7d, 12h, 30m, 0).")
@click.option("--state", "states", multiple=True, type=click.Choice(["SUCCEEDED", "FAILED", "CANCELLED"], case_sensitive=False),
              help="Only jobs that ended in this state (repeatable; default: all finished jobs).")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@guard
def prune(older_than: str, states: tuple[str, ...], dry_run: bool) -> None:
    """Remove every finished job that ended a while ago (as ddpjob rm does, one by one).

    \b
    Examples:
      ddpjob prune                          # finished more than 7 days ago
      ddpjob prune --older-than 0 --state FAILED --dry-run
    """
    from launcher.cli.show import size_text
    from launcher.core.states import JobState
    from launcher.service import cleanup
    from launcher.service.jobs import Jobs

    removed = cleanup.prune(Jobs(), older_than_s=cleanup.parse_duration(older_than),
                            states={JobState(s) for s in states} or None, dry_run=dry_run)
    for r in removed:
        click.echo(f"{r.job_id}: {'would be removed' if dry_run else 'removed'} ({size_text(r.freed)})")
    total = sum(r.freed for r in removed)
    click.echo(f"{len(removed)} job(s), {size_text(total)}" + (" (dry run: nothing removed)" if dry_run else " freed"))


@click.command()
@click.argument("spec_file", required=False, metavar="[SPEC]", shell_complete=complete_spec_files)
@click.option("--target", "-t", type=TARGET_CHOICE, default="local", show_default=True, help="Where to run the check.")
@click.option("--nodes", "-n", type=click.IntRange(min=1), help="Nodes (default: the spec's, else 2).")
@click.option("--procs-per-node", "-p", help="Processes per node (an integer or 'auto').")
@click.option("--set", "user_sets", multiple=True, metavar="KEY=VALUE",
              help="Override a field of the check's spec, e.g. --set nccl.socket_ifname=eth0 (repeatable).")
@click.option("--max-mib", type=click.IntRange(1, 4096), default=256, show_default=True,
              help="Largest all-reduce, in MiB (sizes from 1 MiB, x4 each step).")
@click.option("--iters", type=click.IntRange(1, 100), default=3, show_default=True, help="Timed all-reduces per size.")
@output_option(help="json or yaml: the report as a record, for scripts.")
@click.option("--report", "report_of", metavar="ID", shell_complete=complete_job_ids,
              help="Show the report of doctor job ID again (waiting for it to end); runs nothing new.")
@guard
def doctor(spec_file: str | None, target: str, nodes: int | None, procs_per_node: str | None, user_sets: tuple[str, ...],
           max_mib: int, iters: int, output: str, report_of: str | None) -> None:
    """Run a real job that shows what each rank sees and how fast the ranks all-reduce.

    With a SPEC, the job keeps its settings (image, env, NCCL options, resources, target options)
    and runs the check instead of its command. Each rank reports its backend, NCCL/Gloo variables,
    network interfaces, GPUs and versions; all-reduce is timed from 1 MiB to --max-mib, --iters
    times per size, and reported as algbw and busbw (busbw = algbw x 2(n-1)/n, as nccl-tests: equal
    with 2 ranks). The verdict warns when ranks disagree on settings or the bandwidth is far below
    the link's; when the ranks talk over loopback (one host) it says the bandwidth verdict does not
    apply. --set changes the check's settings as it does a job's (the interface NCCL uses, its env).
    -o json (or -o yaml) has "ok" (no warning), "bandwidth_verdict" and "notes". Exit 1 if the job fails.
    Ctrl-C stops waiting, not the job: --report ID shows its report later.

    \b
    Examples:
      ddpjob doctor --target local --nodes 2
      ddpjob doctor my-job.yaml --target slurm -o json     # with your spec's settings
      ddpjob doctor -t slurm --set nccl.socket_ifname=eth0  # judged against eth0's speed
      ddpjob doctor --report doctor-ab2cd                  # a doctor job's report again
    """
    import json

    from launcher.service.jobs import Jobs, SubmitInterrupted, load
    from launcher.spec.load import load_spec

    jobs = Jobs()
    if report_of is not None:
        if user_sets or spec_file:
            from launcher.core.errors import UsageError

            raise UsageError("--report shows the report of a doctor job that ran: give it without SPEC and --set")
        _doctor_report(jobs, jobs.get(report_of).id, output)
        return
    from launcher.doctor import run as doc

    # The user's --set first: what makes the job a check (its command, one run, its name) wins.
    sets = [*user_sets, f"command={json.dumps(doc.probe_command(max_mib, iters))}", "sweep={}", "name=doctor"]
    if nodes is not None:
        sets.append(f"--nodes={nodes}")
    if procs_per_node is not None:
        sets.append(f"--procs-per-node={procs_per_node}")
    loaded = load(spec_file, overrides=sets) if spec_file else load_spec(None, overrides=sets, base=doc.spec_base(nodes))
    try:
        job_id = jobs.submit(loaded, target).job_id
    except SubmitInterrupted as e:
        _doctor_stopped(e.submission.job_id, "it was submitted")
    _doctor_report(jobs, job_id, output, f"doctor: job {job_id} on {target}, {loaded.spec.nodes} node(s); waiting for it...")


def _doctor_report(jobs: Jobs, job_id: str, output: str, announce: str = "") -> None:
    """Wait for doctor job ``job_id`` and print its report; Ctrl-C leaves it running (exit 130)."""
    try:  # from the first statement: a Ctrl-C right after "waiting for it..." is one too
        if announce:
            click.echo(announce, err=True)
        from launcher.core.errors import DdpjobError
        from launcher.core.states import JobState
        from launcher.doctor import run as doc

        rec = jobs.wait(job_id)
    except KeyboardInterrupt:
        _doctor_stopped(job_id, "stopped waiting")
    if rec.state is not JobState.SUCCEEDED:
        raise DdpjobError(f"the doctor job {job_id} {rec.state.value}: {rec.message} (ddpjob logs {job_id})")
    report = doc.collect(jobs, job_id)
    if output in MACHINE:
        echo(report, output, sort_keys=True)
    else:
        for line in doc.render(report, report["verdict"]):
            click.echo(line)
    sys.exit(0)


def _doctor_stopped(job_id: str, doing: str) -> NoReturn:
    from launcher.cli.follow import after_ctrl_c

    click.echo(after_ctrl_c(job_id, doing=doing, again=("report", f"ddpjob doctor --report {job_id}")), err=True)
    sys.exit(130)


@click.command()
@click.argument("example", required=False, default="quickstart", metavar="[EXAMPLE]", shell_complete=complete_examples)
@click.option("--output", "-o", metavar="FILE", help="Where to write it (default: ./EXAMPLE.yaml; '-' prints it).")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option("--list", "list_", is_flag=True, help="List the examples and exit.")
@guard
def init(example: str, output: str | None, force: bool, list_: bool) -> None:
    """Write an example job spec to start from (default: quickstart).

    The examples ship with ddpjob (a clone of the project has them in its jobs folder): quickstart
    (synthetic data, about a minute on a laptop CPU), sweep, linreg and cifar. They run ddpjob's
    reference trainer (python -m launcher.train), which needs pip install 'ddpjob[train]'.

    \b
    Examples:
      ddpjob init                          # ./quickstart.yaml
      ddpjob init sweep -o my-sweep.yaml
      ddpjob init --list
    """
    import os

    from launcher.core.errors import FileUnusable, UsageError
    from launcher.spec import examples as starters

    if list_:
        for name in starters.names():
            click.echo(f"{name:12} {starters.summary(starters.text(name))}")
        return
    try:
        text = starters.text(example)
    except KeyError:
        raise UsageError(f"no example named {example!r}; the examples are: {', '.join(starters.names())}") from None
    if output == "-":
        click.echo(text, nl=False)
        return
    path = output or f"{example}.yaml"
    try:
        with open(path, "w" if force else "x", encoding="utf-8") as f:
            # 0644 whatever the umask: a spec is built into images (build:), whose user is not its owner.
            os.fchmod(f.fileno(), 0o644)
            f.write(text)
    except FileExistsError:
        raise UsageError(f"{path} exists and was left as it is; choose another file with -o, or add --force") from None
    except OSError as e:
        raise FileUnusable(f"cannot write {path}: {e.strerror or e}") from None
    shown = path if "/" in path else f"./{path}"
    click.echo(f"wrote {shown}: {starters.summary(text)}")
    click.echo(f"run it:  ddpjob submit {path} --target local --nodes 2 -f")

