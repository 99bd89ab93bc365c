"""The queue view: ``ddpjob list`` (age, duration, a sweep's runs, filters) and ``ddpjob cancel``
(one job, several, or ``--all`` that match filters, confirmed). Imports only click at start-up."""

from __future__ import annotations

import sys

import click

from launcher.cli.formats import output_option
from launcher.cli.specopts import TARGET_CHOICE
from launcher.cli.specopts import jobs_service as _jobs
from launcher.cli.support import Seconds, guard
from launcher.cli.tools import complete_job_ids
from launcher.core.fields import COUNT_MAX
from launcher.core.states import JobState

STATE_CHOICE = click.Choice([s.value for s in JobState], case_sensitive=False)


def _filters(fn: click.decorators.FC) -> click.decorators.FC:
    for deco in reversed([
        click.option("--state", "states", type=STATE_CHOICE, multiple=True,
                     help="Only jobs in this state (repeatable; e.g. --state running --state pending)."),
        click.option("--target", "-t", type=TARGET_CHOICE, help="Only jobs of this target."),
        click.option("--name", help="Only jobs whose name matches this glob (e.g. 'sweep-*'; quote it)."),
    ]):
        fn = deco(fn)
    return fn


def _states(states: tuple[str, ...]) -> list[JobState]:
    return [JobState(s.upper()) for s in states]


@click.command(name="list")
@output_option("text", "wide", help="wide: more columns (processes per node, runs ended/all, the scheduler's own "
               "ids, the run directory); json or yaml: a compact record per job.")
@click.option("--limit", type=click.IntRange(0, COUNT_MAX), default=50, show_default=True, help="Newest N jobs (0: all).")
@_filters
@click.option("--du", is_flag=True, help="Also show the disk space each job's run directory uses.")
@click.option("--no-headers", is_flag=True, help="No header line (text and wide), for scripts: "
              "ddpjob list --no-headers | awk '{print $1}'.")
@click.option("--watch", "-w", is_flag=True, help="Print the list, then again every --interval seconds until "
              "Ctrl-C: redrawn in place on a terminal; piped, only the jobs that changed (a line, a JSON line "
              "or a YAML document each).")
@click.option("--interval", type=Seconds(0.5, 3600), metavar="SECONDS",
              help="Seconds between two refreshes of --watch.  [default: 2]")
@guard
def list_(output: str, limit: int, states: tuple[str, ...], target: str | None, name: str | None, du: bool,
          no_headers: bool, watch: bool, interval: float | None) -> None:
    """List jobs, newest first (states of unfinished jobs are refreshed, with their progress).

    AGE is the time since submit, DURATION from its start to its end as its target records them (to now
    while it runs; from submit where the target does not say when it started); a sweep shows how many of
    its runs have ended (runs 2/4). -o wide adds PROCS (per node), RUNS (ended/all),
    NATIVE ID (Slurm's job id, the Kubernetes objects' names) and RUN DIR. -o json gives a compact
    record per job (id, state, shape, native ids, progress, age_s, duration_s, runs_done, rerun_of),
    -o yaml the same record as YAML; the whole spec and handle are in `ddpjob status ID -o json`.

    --watch (-w) keeps the list up to date, as kubectl get -w: on a terminal the table is redrawn
    in place every --interval seconds; piped or redirected, the table is printed once, then a line
    for each job whose state, progress or message changed (its age alone is no change); with -o json
    one JSON object per line, with -o yaml one YAML document each. Ctrl-C stops it (exit 0).

    \b
    Examples:
      ddpjob list --state running --state pending
      ddpjob list --target slurm --name 'sweep-*' -o json
      ddpjob list -o wide
      ddpjob list --no-headers | awk '$3 == "FAILED" {print $1}'
      ddpjob list -w --state running
      ddpjob list -w -o json | jq -r 'select(.state == "FAILED") | .id'
    """
    from launcher.cli.colour import enabled
    from launcher.cli.formats import MACHINE
    from launcher.cli.listing import Query, print_once
    from launcher.cli.listing import watch as watched
    from launcher.core.errors import UsageError

    if no_headers and output in MACHINE:
        raise UsageError(f"--no-headers is for the tables (-o text, -o wide); -o {output} has no header line")
    if interval is not None and not watch:
        raise UsageError("--interval sets how often --watch refreshes: add --watch (-w)")
    q = Query(output, limit, _states(states), target, name, disk=du, headers=not no_headers)
    if watch:
        watched(_jobs(), q, interval or 2.0, colour=enabled(sys.stdout))
    else:
        print_once(_jobs(), q, colour=enabled(sys.stdout))


@click.command()
@click.argument("job_ids", nargs=-1, metavar="[ID]...", shell_complete=complete_job_ids)
@click.option("--task", type=click.IntRange(min=0), help="Cancel only this task of a sweep (its index, as status shows it; on Slurm one array task); the others go on.")
@click.option("--all", "all_", is_flag=True, help="Every unfinished job matching --state/--target/--name (all of them without one).")
@_filters
@click.option("--yes", "-y", is_flag=True, help="Do not ask: needed to cancel several jobs when not on a terminal.")
@guard
def cancel(job_ids: tuple[str, ...], task: int | None, all_: bool, states: tuple[str, ...], target: str | None,
           name: str | None, yes: bool) -> None:
    """Stop jobs and every process they started. Safe to repeat.

    Several jobs at once (several ids, or --all) are listed and confirmed first on a terminal;
    elsewhere (a script, a pipe) give --yes. Unknown ids cancel nothing.

    \b
    Examples:
      ddpjob cancel ID
      ddpjob cancel ID --task 2                     # one element of a sweep (Slurm)
      ddpjob cancel ID1 ID2
      ddpjob cancel --all --target local --yes      # every unfinished local job
      ddpjob cancel --all --name 'sweep-*' --state pending
    """
    from launcher.core.errors import DdpjobError, UsageError
    from launcher.service.queue import queue

    service = _jobs()
    if all_ and job_ids:
        raise UsageError("give job ids or --all, not both")
    if not all_ and not job_ids:
        raise UsageError("give the id of the job to cancel (ddpjob list shows them), or --all with filters")
    if not all_ and (states or target or name):
        raise UsageError("--state, --target and --name choose jobs for --all: ddpjob cancel --all --state running")
    if task is not None and (all_ or len(job_ids) != 1):
        raise UsageError("--task cancels one run of one job: give exactly one id")
    if all_:
        wanted = _states(states) or [s for s in JobState if not s.terminal]
        chosen = [e.rec for e in queue(service.registry, limit=None, target=target, states=wanted, name=name)
                  if not e.rec.state.terminal]
        if not chosen:
            click.echo("no unfinished job matches; nothing to cancel")
            return
    else:
        chosen = list({r.id: r for r in (service.get(j) for j in job_ids)}.values())  # all known, or none cancelled
    if (all_ or len(chosen) > 1) and not yes:
        _confirm([r.id + f"  ({r.target}, {r.state.value})" for r in chosen])
    from launcher.service.jobs import Cancelled

    failed = 0
    for rec in chosen:
        try:
            result = service.cancel(rec.id, task)
        except DdpjobError as e:
            if len(chosen) == 1:
                raise
            click.echo(f"ddpjob: error: {rec.id}: {e}", err=True)
            failed = failed or e.exit_code
            continue
        if result is Cancelled.ALREADY_ENDED:
            click.echo(f"{rec.id} already ended: {service.get(rec.id).state.value}")
        elif result is Cancelled.RELEASED:
            click.echo(f"{rec.id} already ended ({service.get(rec.id).state.value}), but {rec.target} still held "
                       "its allocation: cancelled it there")
        elif result is Cancelled.TASK_CANCELLED:
            click.echo(f"{rec.id}: task {task} cancelled; the other tasks go on")
        else:
            click.echo(f"{rec.id}: CANCELLED")
            note = service.cancel_note(rec.id)
            if note:
                click.echo(f"note: {note}", err=True)
    if failed:
        sys.exit(failed)


def _confirm(lines: list[str]) -> None:
    """Ask on a terminal; refuse (exit 2) without one: several jobs are never cancelled unasked."""
    from launcher.core.errors import UsageError

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(f"this would cancel {_counted(len(lines))}; add --yes to do it without a terminal to ask on "
                         "(nothing was cancelled)")
    click.echo("This job will be cancelled:" if len(lines) == 1 else f"These {len(lines)} jobs will be cancelled:")
    for line in lines:
        click.echo(f"  {line}")
    if not click.confirm("Cancel it?" if len(lines) == 1 else "Cancel them?", default=False):
        click.echo("Nothing was cancelled.", err=True)
        sys.exit(1)


def _counted(count: int) -> str:
    return "1 job" if count == 1 else f"{count} jobs"
