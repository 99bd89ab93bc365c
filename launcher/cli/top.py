"""``ddpjob top``: every rank of a job, live (issue 34). Imports only click at start-up."""

from __future__ import annotations

import sys
import time

import click

from launcher.cli.formats import MACHINE, echo, output_option
from launcher.cli.specopts import jobs_service as _jobs
from launcher.cli.support import Seconds, guard
from launcher.cli.tools import complete_job_ids


@click.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@output_option(help="json: one sample as a JSON object (per node, per rank), for scripts; yaml: the same "
              "record as YAML; both imply --once.")
@click.option("--once", is_flag=True, help="Print one sample and exit (what a script or a log wants).")
@click.option("--interval", type=Seconds(0.5, 3600), default=2.0, show_default=True, metavar="SECONDS",
              help="Seconds between refreshes.")
@guard
def top(job_id: str, output: str, once: bool, interval: float) -> None:
    """Show every rank of a job, node by node, refreshing in place like top: its state (a stopped
    rank says since when), CPU use, resident memory, the age of its last output line, and with
    ddpjob's trainer its step and its own work per step (data + compute, without waiting on its
    peers); on a GPU machine each rank's GPU, its use and memory ("no GPU" elsewhere), and under the
    table each node's GPUs (inside a container nvidia-smi cannot tell which rank is on which GPU:
    ddpjob's trainer says so itself, another program's ranks show -). A rank named STUCK or
    STRAGGLER is the one status names. Samples come from each node's runner every few
    seconds (stall watch); a node not heard for 10 s is flagged SILENT with how long (its rows are its
    last sample, not the present: its runner frozen, cut off or gone); after the job ends it shows the last one, the ranks of a local node
    that ended "exited" with their exit code (0 when their node's torchrun ended 0). Ctrl-C leaves.

    \b
    Examples:
      ddpjob top ID
      ddpjob top ID --once
      ddpjob top ID -o json | jq '.health.nodes[].ranks[] | {rank, cpu_pct, output_age_s}'
    """
    service = _jobs()
    live = output == "text" and not once
    tty = sys.stdout.isatty()
    try:
        while True:
            rec, st = service.refresh(job_id)
            health = service.health(rec)
            state = st.state if st is not None else rec.state
            if output in MACHINE:
                echo({"id": rec.id, "state": state.value, "health": health.to_json() if health is not None else None},
                     output)
                return
            lines = _screen(rec.id, state.value, health)
            if live and tty:
                click.echo("\x1b[H\x1b[2J", nl=False)  # the screen redrawn in place, as top does
            click.echo("\n".join(lines))
            if not live or state.terminal:
                return
            time.sleep(interval)
            if not tty:
                click.echo("")
    except KeyboardInterrupt:
        return


def _screen(job_id: str, state: str, health: object) -> list[str]:
    from launcher.targets.shared.health import JobHealth, notes, table

    head = f"job {job_id}: {state}  ({time.strftime('%H:%M:%S')})"
    if not isinstance(health, JobHealth):
        return [head, "no sample of its ranks yet (the nodes' runners sample every few seconds; a job on "
                      "Kubernetes with k8s.runner: none, or an elastic one, keeps none)"]
    lines = [head]
    if health.updated:
        lines[0] += f"; sampled {max(0.0, time.time() - health.updated):.0f}s ago" + (
            f" (task {health.task})" if health.task else "")
    if health.note:
        lines.append(health.note)
    lines += ["", *table(health)]
    below = notes(health)
    if below:
        lines += ["", *below]
    return lines
