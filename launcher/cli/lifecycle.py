"""The commands of a job's life: ``submit``, ``render``, ``validate``, ``schema``, ``status``, ``logs``
and ``wait``. Click commands only: heavy imports happen inside each command; ``commands`` lists them
with every other command."""

from __future__ import annotations

import sys
import time

import click

from launcher.cli.formats import MACHINE, echo, output_option
from launcher.cli.specopts import TARGET_CHOICE, CommandAfterDashes, typed_command
from launcher.cli.specopts import jobs_service as _jobs
from launcher.cli.specopts import load as _load
from launcher.cli.specopts import overrides as _overrides
from launcher.cli.specopts import resolve_target as _target
from launcher.cli.specopts import spec_options as _spec_options
from launcher.cli.support import guard as _guard
from launcher.cli.support import interrupted as _interrupted
from launcher.cli.tools import complete_job_ids, complete_spec_files
from launcher.core.fields import COUNT_MAX
from launcher.core.states import JobState


@click.command(cls=CommandAfterDashes)
@click.argument("args", nargs=-1, metavar="[SPEC | - | -- COMMAND...]", shell_complete=complete_spec_files)
@_spec_options
@click.option("--dry-run", type=click.Choice(["client", "server"], case_sensitive=False), is_flag=False, flag_value="client",
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
      ddpjob submit quickstart.yaml --target local --nodes 2 -f   # ddpjob init writes it
      ddpjob submit sweep.yaml --target slurm                     # ddpjob init sweep
      ddpjob submit --target local --nodes 2 -- python train.py --lr 0.1
      ddpjob submit my-job.yaml -t k8s --set k8s.namespace=ml --dry-run

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
    service, target = _jobs(), _target(target, loaded)
    if dry_run == "server":
        service.check_server_dry_run(target)
    if dry_run:
        plan = service.plan(loaded, target, online=dry_run == "server")
        click.echo(plan.render(), nl=False)
        if dry_run == "server":
            click.echo(service.server_dry_run(plan))
        return
    from launcher.cli.follow import submit_and_report

    submit_and_report(service, loaded, target, follow=follow, quiet=quiet, preflight=not no_preflight)


@click.command()
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
      ddpjob render my-job.yaml --target k8s --nodes 4
    """
    loaded = _load((spec_file,), _overrides(sets, nodes, procs_per_node, name))
    click.echo(_jobs().plan(loaded, _target(target, loaded)).render(), nl=False)


@click.command()
@click.argument("spec_files", nargs=-1, required=True, metavar="SPEC...", shell_complete=complete_spec_files)
@click.option("--target", "-t", type=TARGET_CHOICE, help="Also run this target's checks (e.g. the PyTorchJob CRD schema).")
@click.option("--nodes", "-n", type=int, help="Override nodes (in every spec given).")
@click.option("--procs-per-node", "-p", help="Override procs_per_node (an integer or 'auto').")
@click.option("--name", help="Override the job name.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any field, e.g. --set resources.cpus=4 (repeatable).")
@_guard
def validate(spec_files: tuple[str, ...], target: str | None, nodes: int | None, procs_per_node: str | None,
             name: str | None, sets: tuple[str, ...]) -> None:
    """Check spec files (- reads one from standard input) and report every problem with file, line
    and field. Exit 2 if any is wrong. Overrides apply before the checks, as at submit.

    \b
    Examples:
      ddpjob validate *.yaml --target k8s
      ddpjob validate job.yaml --nodes 3 --set resources.cpus=4
    """
    import math

    from launcher.core.errors import SpecError

    bad = 0
    service = _jobs()
    for f in spec_files:
        try:
            loaded = _load((f,), _overrides(sets, nodes, procs_per_node, name))
            plan = service.plan(loaded, target) if target else None
        except SpecError as e:
            bad += 1
            click.echo(e.render(checking=True), err=True)
            continue
        runs = plan.runs if plan else math.prod(len(v) for v in loaded.spec.sweep.values())
        # A target may say what it checked (k8s: whether the strict CRD check ran, or why not).
        checks = (plan.checks or f"{target} checks passed") if plan else ""
        click.echo(f"{f}: ok ({loaded.spec.nodes} node(s), {runs} task(s)" + (f", {checks})" if checks else ")"))
    if bad:
        sys.exit(2)


@click.command()
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


@click.command()
@click.argument("job_id", metavar="[ID]", required=False, shell_complete=complete_job_ids)
@output_option(help="json or yaml: the whole record (spec, handle, status, progress); yaml is the json's record.")
@click.pass_context
@_guard
def status(ctx: click.Context, job_id: str | None, output: str) -> None:
    """Show a job's state, each run's nodes and exit codes, and the root cause of a failure; without
    an ID, the newest jobs (as `ddpjob list --limit 10`).

    \b
    Examples:
      ddpjob status                  # which jobs are there?
      ddpjob status quickstart-ab2   # one job (a unique prefix of its id is enough)
      ddpjob status quickstart-ab2 -o yaml
    """
    if job_id is None:
        from launcher.cli.queue import list_

        ctx.invoke(list_, output=output, limit=10, states=(), target=None, name=None, du=False, no_headers=False,
                   watch=False, interval=None)
        if output == "text":
            click.echo("(ddpjob status ID shows one job: its runs, nodes and root cause)", err=True)
        return

    from launcher.service.notifier import state_of

    service = _jobs()
    rec, st = service.refresh(job_id)
    progress = service.progress(rec)
    if output in MACHINE:
        data = rec.to_json()
        data["status"] = st.to_json() if st else None
        data["progress"], data["notify"] = progress.to_json() if progress else None, state_of(rec)
        echo(data, output, sort_keys=True)
        return
    from launcher.cli.colour import enabled
    from launcher.cli.show import status_lines

    for line in status_lines(rec, st, progress, colour=enabled(sys.stdout)):
        click.echo(line)


@click.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends; exit 1 if it FAILED or was CANCELLED (as wait).")
@click.option("--node", type=click.IntRange(min=0), help="Only this node (0-based).")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank.")
@click.option("--task", type=click.IntRange(min=0), help="Only this task of a sweep (its index, 0-based, as status shows it).")
@click.option("--tail", type=click.IntRange(0, COUNT_MAX),
              help="Only the last N lines of each node (of each run): N x nodes lines in all.")
@click.option("--verbose", "-v", is_flag=True, help="Also torchrun's own log records and tracebacks (hidden by default).")
@_guard
def logs(job_id: str, follow: bool, node: int | None, rank: int | None, task: int | None, tail: int | None,
         verbose: bool) -> None:
    """Print a job's output; every line is prefixed with its node and rank. torchrun's own
    tracebacks and log records are left out (a failed or stopped rank makes every agent raise one);
    ddpjob's root cause names the rank, and --verbose shows them. With -f, it follows until the
    job ends and exits like `wait`: 0 if it SUCCEEDED, 1 if it FAILED or was CANCELLED.

    \b
    Examples:
      ddpjob logs ID -f
      ddpjob logs ID --node 1 --tail 20
      ddpjob logs ID --task 1          # one element of a sweep

    --tail N is per node: the last N lines of every node's log (on Kubernetes, of every pod), so
    a 2-node job shows up to 2N lines; with --node, N lines of that node.
    """
    from launcher.targets.base import LogFilter

    service = _jobs()
    flt = LogFilter(task=task, node=node, rank=rank, tail=tail, verbose=verbose)
    if follow:
        from launcher.cli.follow import follow_to_end

        sys.exit(follow_to_end(service, job_id, flt))
    from launcher.cli import colour

    coloured = colour.enabled(sys.stdout)
    for line in service.logs(job_id, flt, follow=False):
        click.echo(colour.line(line, coloured))


@click.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124; the job keeps running).")
@_guard
def wait(job_id: str, timeout: float | None) -> None:
    """Wait until a job ends. Exit 0 only if it SUCCEEDED, 1 otherwise; Ctrl-C (exit 130) stops
    waiting, not the job.

    \b
    Example:
      ddpjob wait ID --timeout 3600 && echo done
    """
    from launcher.cli.follow import wait_line

    service = _jobs()
    live = sys.stderr.isatty()  # a one-line live stage or progress on a terminal, never when piped
    try:
        rec = service.wait(job_id, timeout, on_poll=wait_line(service, time.monotonic()) if live else None)
    except KeyboardInterrupt:
        from launcher.cli.follow import after_ctrl_c

        job_id = service.get(job_id).id  # the whole id, from the prefix given
        click.echo(("\r\033[K" if live else "") + after_ctrl_c(job_id, doing="stopped waiting",
                                                                    again=("wait", f"ddpjob wait {job_id}")), err=True)
        sys.exit(130)
    if live:
        click.echo("\r\033[K", err=True, nl=False)
    from launcher.cli import colour

    shown = colour.state(rec.state.value, rec.state.value, colour.enabled(sys.stdout))
    click.echo(f"{rec.id}: {shown}" + (f": {rec.message}" if rec.message else ""))
    sys.exit(0 if rec.state is JobState.SUCCEEDED else 1)
