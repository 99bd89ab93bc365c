"""The ``ddpjob`` command line. Click commands only: heavy imports happen inside each command.

Exit codes: ``launcher.core.exitcodes.EXIT_CODES`` (listed by ``ddpjob --help`` and the README).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.specopts import TARGET_CHOICE, CommandAfterDashes, typed_command
from launcher.cli.specopts import jobs_service as _jobs
from launcher.cli.specopts import load as _load
from launcher.cli.specopts import overrides as _overrides
from launcher.cli.specopts import spec_options as _spec_options
from launcher.cli.support import DEBUG, exit_codes_help, flush_stdout
from launcher.cli.support import guard as _guard
from launcher.cli.support import interrupted as _interrupted
from launcher.cli.tools import TOOLS, complete_job_ids, complete_spec_files
from launcher.cli.ui import ui as _ui
from launcher.core.fields import COUNT_MAX
from launcher.core.states import JobState

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs, Submission

@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=exit_codes_help())
@click.version_option(package_name="ddpjob", prog_name="ddpjob")
@click.option("--debug", is_flag=True, help="Show full tracebacks for unexpected errors (or set DDPJOB_DEBUG=1).")
def cli(debug: bool) -> None:
    """Launch PyTorch DDP training from one spec, on this machine, Slurm or Kubernetes.

    \b
    Quick start:
      ddpjob init                                    # writes ./quickstart.yaml (ddpjob init --list)
      ddpjob submit quickstart.yaml --target local --nodes 2 -f
      ddpjob submit --target local --nodes 2 -- python train.py --lr 0.1
      ddpjob render jobs/cifar.yaml --target k8s     # what would be submitted
      ddpjob list;  ddpjob status ID;  ddpjob logs ID -f;  ddpjob cancel ID

    Jobs are recorded under $DDPJOB_HOME (default ~/.ddpjob), so any later shell can follow them.
    """
    if debug:
        DEBUG["on"] = True


# --------------------------------------------------------------------------- commands

@cli.command(cls=CommandAfterDashes)
@click.argument("args", nargs=-1, metavar="[SPEC | - | -- COMMAND...]", shell_complete=complete_spec_files)
@_spec_options
@click.option("--dry-run", type=click.Choice(["client", "server"]), is_flag=False, flag_value="client",
              default=None, help="Print the plan and stop: nothing is submitted or recorded. "
              "--dry-run=server also asks the scheduler to check it (Kubernetes: dryRun=All).")
@click.option("--follow", "-f", is_flag=True, help="Stream logs until the job ends; exit with its result.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the job id.")
@click.option("--no-preflight", is_flag=True, help="Do not check first that the script or module exists "
              "(from the job's working directory; on Slurm, a filesystem shared with the nodes is assumed).")
@_guard
def submit(args: tuple[str, ...], target: str, nodes: int | None, procs_per_node: str | None, name: str | None,
           sets: tuple[str, ...], dry_run: str | None, follow: bool, quiet: bool, no_preflight: bool) -> None:
    """Submit a job from a spec file (- reads it from standard input), or a command given after --.

    \b
    Examples:
      ddpjob submit jobs/quickstart.yaml --target local --nodes 2 -f
      ddpjob submit jobs/sweep.yaml --target slurm
      ddpjob submit --target local --nodes 2 -- python train.py --lr 0.1
      ddpjob submit jobs/cifar.yaml -t k8s --set k8s.namespace=ml --dry-run

    Everything after -- is the command, passed to torchrun as it is (never through a shell);
    without --, the argument is a spec file, whatever its name. The job id is printed at once.
    """
    try:
        loaded = _load(args, _overrides(sets, nodes, procs_per_node, name), typed_command(), command_hint=True)
    except Exception as e:
        if not _interrupted(e):
            raise
        click.echo("\nStopped: nothing was submitted.", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("\nStopped: nothing was submitted.", err=True)
        sys.exit(130)
    service = _jobs()
    if dry_run:
        plan = service.plan(loaded, target, online=dry_run == "server")
        click.echo(plan.render(), nl=False)
        if dry_run == "server":
            click.echo(service.server_dry_run(plan))
        return
    from launcher.core.interrupts import deferred_interrupt
    from launcher.service.jobs import SubmitInterrupted

    # Ctrl-C from here on waits until the job is recorded and its id printed (at most the target's
    # own timeouts): a job is never submitted without the user learning its id.
    with deferred_interrupt() as held:
        try:
            done = service.submit(loaded, target, preflight=not no_preflight)
        except SubmitInterrupted as e:
            done = e.submission
            held.append(signal.SIGINT)
        _print_submitted(done, target, quiet=quiet, hints=not follow and not held)
    if held:
        click.echo(f"\nCtrl-C: {done.job_id} was submitted and runs.\n  follow:  ddpjob logs {done.job_id} -f\n"
                   f"  cancel:  ddpjob cancel {done.job_id}", err=True)
        sys.exit(130)
    if follow:
        sys.exit(_follow_to_end(service, done.job_id))


def _print_submitted(done: Submission, target: str, *, quiet: bool, hints: bool) -> None:
    job_id, plan = done.job_id, done.plan
    if quiet:
        click.echo(job_id)
        sys.stdout.flush()
        return
    click.echo(f"Submitted {job_id} to {target}: {plan.shape()}")
    click.echo(f"  run dir: {plan.run_dir}")
    job_dir = done.handle.log_dir()
    if job_dir:
        click.echo(f"  job dir: {job_dir}  (scripts, node logs and outputs on the cluster)")
    if hints:
        click.echo(f"  follow:  ddpjob logs {job_id} -f")
        click.echo(f"  status:  ddpjob status {job_id}")
    sys.stdout.flush()


def _follow_to_end(service: Jobs, job_id: str, flt: Any = None) -> int:
    from launcher.core.progress import describe
    from launcher.targets.base import LogFilter

    live = sys.stderr.isatty() and sys.stdout.isatty()  # progress between the lines, on a terminal only
    shown = time.monotonic()
    try:
        for line in service.logs(job_id, flt or LogFilter(), follow=True):
            click.echo(line)
            if live and time.monotonic() - shown > 15:
                shown = time.monotonic()
                progress = describe(service.progress(service.get(job_id)))
                if progress:
                    click.echo(f"[ddpjob] {job_id}: {progress}", err=True)
        rec, _ = service.refresh(job_id)
    except KeyboardInterrupt:
        click.echo(f"\nStopped following; {job_id} keeps running. Cancel it with: ddpjob cancel {job_id}", err=True)
        return 130
    click.echo(f"{rec.id}: {rec.state.value}" + (f": {rec.message}" if rec.message else ""), err=True)
    return 0 if rec.state is JobState.SUCCEEDED else 1


@cli.command()
@click.argument("spec_file", metavar="SPEC", shell_complete=complete_spec_files)
@_spec_options
@_guard
def render(spec_file: str, target: str, nodes: int | None, procs_per_node: str | None, name: str | None,
           sets: tuple[str, ...]) -> None:
    """Print exactly what would be submitted (torchrun lines, sbatch script, PyTorchJob); touch nothing.

    The job id is shown as <name>-xxxxx and, locally, the rendezvous port as <port>: both are
    chosen at submit. SPEC - reads the spec from standard input.

    \b
    Example:
      ddpjob render jobs/cifar.yaml --target k8s --nodes 4
    """
    loaded = _load((spec_file,), _overrides(sets, nodes, procs_per_node, name))
    click.echo(_jobs().plan(loaded, target).render(), nl=False)


@cli.command()
@click.argument("spec_files", nargs=-1, required=True, metavar="SPEC...", shell_complete=complete_spec_files)
@click.option("--target", "-t", type=TARGET_CHOICE, help="Also run this target's checks (e.g. the PyTorchJob CRD schema).")
@_guard
def validate(spec_files: tuple[str, ...], target: str | None) -> None:
    """Check spec files (- reads one from standard input) and report every problem with file, line
    and field. Exit 2 if any is wrong.

    \b
    Example:
      ddpjob validate jobs/*.yaml --target k8s
    """
    import math

    from launcher.core.errors import SpecError

    bad = 0
    service = _jobs()
    for f in spec_files:
        try:
            loaded = _load((f,), [])
            plan = service.plan(loaded, target) if target else None
        except SpecError as e:
            bad += 1
            click.echo(e.render(), err=True)
            continue
        runs = plan.runs if plan else math.prod(len(v) for v in loaded.spec.sweep.values())
        # A target may say what it checked (k8s: whether the strict CRD check ran, or why not).
        checks = (plan.checks or f"{target} checks passed") if plan else ""
        click.echo(f"{f}: ok ({loaded.spec.nodes} node(s), {runs} run(s)" + (f", {checks})" if checks else ")"))
    if bad:
        sys.exit(2)


@cli.command()
@_guard
def schema() -> None:
    """Print the JSON Schema of job specs (for editor completion and validation).

    \b
    Example (VS Code, YAML extension):
      ddpjob schema > ddpjob.schema.json
      # then in a spec: # yaml-language-server: $schema=./ddpjob.schema.json
    """
    import json

    from launcher.spec.model import json_schema

    click.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


@cli.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_guard
def status(job_id: str, output: str) -> None:
    """Show a job's state, each run's nodes and exit codes, and the root cause of a failure."""
    import json

    service = _jobs()
    rec, st = service.refresh(job_id)
    progress = service.progress(rec)
    if output == "json":
        data = rec.to_json()
        data["status"] = st.to_json() if st else None
        data["progress"] = progress
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    from launcher.cli.show import status_lines

    for line in status_lines(rec, st, progress):
        click.echo(line)


@cli.command(name="list")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--limit", type=click.IntRange(0, COUNT_MAX), default=50, show_default=True, help="Newest N jobs (0: all).")
@click.option("--target", "-t", type=TARGET_CHOICE, help="Only jobs of this target.")
@click.option("--du", is_flag=True, help="Also show the disk space each job's run directory uses.")
@_guard
def list_(output: str, limit: int, target: str | None, du: bool) -> None:
    """List jobs, newest first (states of unfinished jobs are refreshed, with their progress).

    -o json gives a compact record per job (id, state, shape, native ids, progress); the whole
    spec and handle are in `ddpjob status ID -o json`.
    """
    import json

    from launcher.cli.show import job_summary, job_table

    service = _jobs()
    fresh = service.list_jobs(limit=limit or None, target=target)
    progress = {r.id: service.progress(r) for r in fresh if not r.state.terminal}
    if output == "json":  # compact: the whole spec and handle stay in status -o json
        click.echo(json.dumps([job_summary(r, progress.get(r.id), service.native_ids(r)) for r in fresh],
                              indent=2, sort_keys=True))
        return
    if not fresh:
        click.echo("no jobs yet; submit one with: ddpjob submit jobs/quickstart.yaml --target local --nodes 2")
        return
    for line in job_table(fresh, progress, disk=du):
        click.echo(line)


@cli.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends.")
@click.option("--node", type=click.IntRange(min=0), help="Only this node (0-based).")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank.")
@click.option("--task", type=click.IntRange(min=0), help="Only this run of a sweep (0-based).")
@click.option("--tail", type=click.IntRange(0, COUNT_MAX), help="Only the last N lines of each source.")
@_guard
def logs(job_id: str, follow: bool, node: int | None, rank: int | None, task: int | None, tail: int | None) -> None:
    """Print a job's output; every line is prefixed with its node and rank.

    \b
    Examples:
      ddpjob logs ID -f
      ddpjob logs ID --node 1 --tail 20
      ddpjob logs ID --task 1          # one element of a sweep
    """
    from launcher.targets.base import LogFilter

    service = _jobs()
    flt = LogFilter(task=task, node=node, rank=rank, tail=tail)
    if follow:
        code = _follow_to_end(service, job_id, flt)
        sys.exit(0 if code in (0, 1) else code)
    for line in service.logs(job_id, flt, follow=False):
        click.echo(line)


@cli.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--task", type=click.IntRange(min=0), help="Cancel only this run of a sweep (Slurm array element); the others go on.")
@_guard
def cancel(job_id: str, task: int | None) -> None:
    """Stop a job and every process it started. Safe to repeat.

    \b
    Examples:
      ddpjob cancel ID
      ddpjob cancel ID --task 2     # one element of a sweep (Slurm)
    """
    from launcher.service.jobs import Cancelled

    service = _jobs()
    result = service.cancel(job_id, task)
    rec = service.get(job_id)
    if result is Cancelled.ALREADY_ENDED:
        click.echo(f"{rec.id} already ended: {rec.state.value}")
    elif result is Cancelled.TASK_CANCELLED:
        click.echo(f"{rec.id}: task {task} cancelled; the other tasks go on")
    else:
        click.echo(f"{rec.id}: CANCELLED")
        note = service.cancel_note(rec.id)
        if note:
            click.echo(f"note: {note}", err=True)


@cli.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124; the job keeps running).")
@_guard
def wait(job_id: str, timeout: float | None) -> None:
    """Wait until a job ends. Exit 0 only if it SUCCEEDED, 1 otherwise."""
    service = _jobs()
    live = sys.stderr.isatty()  # a one-line live progress on a terminal, never when piped

    def show(rec: Any) -> None:
        from launcher.core.progress import describe

        line = f"{rec.id}: {rec.state.value}" + (f", {describe(p)}" if (p := service.progress(rec)) else "")
        click.echo(f"\r\033[K{line[:200]}", err=True, nl=False)

    rec = service.wait(job_id, timeout, on_poll=show if live else None)
    if live:
        click.echo("\r\033[K", err=True, nl=False)
    click.echo(f"{rec.id}: {rec.state.value}" + (f": {rec.message}" if rec.message else ""))
    sys.exit(0 if rec.state is JobState.SUCCEEDED else 1)


for _tool in TOOLS:  # completion, rm, prune, doctor, init (launcher/cli/tools.py)
    cli.add_command(_tool)
cli.add_command(_ui)  # the dashboard (launcher/cli/ui.py)


def main() -> None:
    # Private files: the registry, plans and logs may hold secrets (the jobs inherit it too).
    os.umask(os.umask(0o077) | 0o077)
    try:
        # standalone_mode=False: a Ctrl-C before a command's own handling (while click parses) is
        # exit 130 like any other, not click's "Aborted!" with exit 1.
        try:
            code = cli.main(prog_name="ddpjob", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("\nStopped.", err=True)
            sys.exit(130)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)
    except SystemExit:
        # The command is done: a Ctrl-C now would only lose buffered output (a printed job id).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        flush_stdout()  # here, not at interpreter exit, so a reader that left means exit 0
        raise
    except BrokenPipeError:
        # `ddpjob logs ID | head`: the reader left; not an error. Keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    main()
