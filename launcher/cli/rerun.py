"""``ddpjob rerun ID``: submit a recorded job's spec again, with overrides. Imports only click at
start-up."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from launcher.cli.specopts import ENV_FILE_OPTION, ENV_OPTION, TARGET_CHOICE
from launcher.cli.specopts import jobs_service as _jobs
from launcher.cli.specopts import overrides as _overrides
from launcher.cli.support import guard
from launcher.cli.tools import complete_job_ids

if TYPE_CHECKING:
    from launcher.service.registry import JobRecord


@click.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--target", "-t", type=TARGET_CHOICE, help="Where to run (default: where ID ran).")
@click.option("--nodes", "-n", type=int, help="Override nodes.")
@click.option("--procs-per-node", "-p", help="Override procs_per_node (an integer or 'auto').")
@click.option("--name", help="Override the job name.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any field, e.g. --set env.SEED=2 (repeatable).")
@ENV_FILE_OPTION
@ENV_OPTION
@click.option("--resume", is_flag=True,
              help="Go on from the checkpoints ID's runs left: each new run gets DDPJOB_RESUME_FROM, the output "
                   "folder of ID's run of the same index, where the reference trainer loads its newest checkpoint "
                   "from while its own folder has none (a program of your own reads the variable the same way).")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop: nothing is submitted or recorded.")
@click.option("--follow", "-f", is_flag=True, help="Stream logs until the job ends; exit with its result.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the new job id.")
@click.option("--no-preflight", is_flag=True, help="Do not check first that the script or module exists.")
@guard
def rerun(job_id: str, target: str | None, nodes: int | None, procs_per_node: str | None, name: str | None,
          sets: tuple[str, ...], resume: bool, dry_run: bool, follow: bool, quiet: bool, no_preflight: bool) -> None:
    """Submit the spec a job ran with again, with overrides; the new job records which job it reruns.

    \b
    Examples:
      ddpjob rerun ID                         # the same job again, where it ran
      ddpjob rerun ID --set env.SEED=2 -f     # with a change, following its logs
      ddpjob rerun ID --target slurm --nodes 4
      ddpjob rerun ID --env-file .env         # env variables (secrets too) from a dotenv file
      ddpjob rerun ID --resume                # a job that ended early: on from its checkpoints

    The spec is the one recorded for ID (status -o json shows it), run from the folder ID was
    submitted from. Secret values are never stored: each is read again from the spec file it
    came from, and one that came from the command line (or the file no longer holds) must be
    given again (--set env.NAME=VALUE, --env or --env-file); env_from_host names are read from your shell, as at
    submit. `ddpjob status NEW` and `ddpjob list -o json` show `rerun_of`.
    """
    from launcher.cli.specopts import given_values, with_env_files
    from launcher.service.origin import rerun_spec

    service = _jobs()
    rec = service.get(job_id)
    sets = (*sets, *_resume(rec, resume, quiet))
    loaded = with_env_files(rerun_spec(rec, _overrides(sets, nodes, procs_per_node, name), given_values()))
    where = (loaded.origin or {}).get("cwd")
    if isinstance(where, str) and where and where != os.getcwd():
        # Relative paths in the spec (the script, workdir, Slurm's folder) mean what they meant then.
        try:
            os.chdir(where)
        except OSError as e:
            click.echo(f"note: {where}, where {rec.id} was submitted from, cannot be used ({e.strerror}); "
                       "running from here", err=True)
            loaded.origin = {**(loaded.origin or {}), "cwd": os.getcwd()}
    chosen = target or rec.target
    if dry_run:
        click.echo(service.plan(loaded, chosen).render(), nl=False)
        return
    from launcher.cli.follow import submit_and_report

    if not quiet:
        from launcher.spec.secrets import mask_override, printable

        shown = ", ".join(printable(mask_override(s)) for s in sets)
        click.echo(f"Rerunning {rec.id}" + (f" with {shown}" if shown else ""))
    submit_and_report(service, loaded, chosen, follow=follow, quiet=quiet, preflight=not no_preflight)


def _resume(rec: JobRecord, resume: bool, quiet: bool) -> list[str]:
    """``--resume``: the override that points each new run at the checkpoints of ``rec``'s run of the same
    index. Without it, a job that ended early and left checkpoints has the rerun say how to go on from them."""
    from launcher.core.errors import UsageError
    from launcher.service.results import RESUME_FROM_ENV, resume_from

    if not resume and (quiet or rec.state.value == "SUCCEEDED"):
        return []  # nothing to say: no metrics file read
    where, steps = resume_from(rec)
    if resume:
        if where is None:
            raise UsageError(f"--resume: the output folders of {rec.id}'s runs cannot be named from here "
                             f"({'in its pods' if rec.target == 'k8s' else 'not one pattern for all runs'}); set "
                             f"--set env.{RESUME_FROM_ENV}=FOLDER to a folder the new runs can read")
        import json

        return [f"env.{RESUME_FROM_ENV}={json.dumps(where)}"]  # quoted: a folder's name is no YAML
    if steps:
        left = ", ".join(f"run {i} at step {step}" for i, step in sorted(steps.items()))
        click.echo(f"note: {rec.id} ended {rec.state.value} and left checkpoints ({left}); this rerun starts "
                   f"from the beginning: ddpjob rerun {rec.id} --resume goes on from them", err=True)
    return []
