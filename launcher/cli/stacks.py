"""``ddpjob stacks``: where every rank is, its Python stack read from outside by py-spy (issue 44).
Imports only click at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from launcher.cli.formats import MACHINE, echo, output_option
from launcher.cli.specopts import jobs_service as _jobs
from launcher.cli.support import guard
from launcher.cli.tools import complete_job_ids

if TYPE_CHECKING:
    from launcher.targets.shared.stacks import JobStacks, RankStack


@click.command()
@click.argument("job_id", metavar="ID", shell_complete=complete_job_ids)
@click.option("--task", type=click.IntRange(min=0), help="Only this task of a sweep (its index, as status shows it; "
              "default: the latest with live ranks).")
@click.option("--node", type=click.IntRange(min=0), help="Only this node (0-based).")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank.")
@click.option("--verbose", "-v", is_flag=True, help="Every frame of every thread, one per line, with whole file names.")
@output_option(help="json or yaml: per rank its node, pid and threads, each thread's frames innermost first.")
@guard
def stacks(job_id: str, task: int | None, node: int | None, rank: int | None, verbose: bool, output: str) -> None:
    """Show where every rank of a running job is: each rank's Python stack, every thread, read from
    outside the rank by py-spy (it pauses the rank for about a millisecond and needs nothing from the
    program). One line per thread, the innermost frame first; -v shows every frame.

    Needs py-spy: pip install 'ddpjob[stacks]' (without it: exit 3, saying so; DDPJOB_PY_SPY names
    another binary). Reading another process needs ptrace: as the ranks' user where
    kernel.yama.ptrace_scope is 0, else as root; a rank that cannot be read says why. On the local
    target (without local.container) and on Slurm, where each node's runner reads its own ranks
    (py-spy installed where the job runs) and answers through the job's shared folder; on Kubernetes
    each pod's runner reads its own (py-spy in the image) and answers through the API server's pod proxy.

    \b
    Examples:
      ddpjob stacks ID
      ddpjob stacks ID --rank 3 -v
      ddpjob stacks ID -o json | jq '.ranks[] | {rank, top: .threads[0].frames[0]}'
    """
    from launcher.targets.base import LogFilter

    found = _jobs().stacks(job_id, LogFilter(task=task, node=node, rank=rank))
    if output in MACHINE:
        echo({"id": job_id, **found.to_json()}, output)
        return
    click.echo("\n".join(lines(found, verbose=verbose)))


def lines(found: JobStacks, *, verbose: bool = False) -> list[str]:
    """The text ``stacks`` prints: per rank a head line, then one line per thread (innermost frame first,
    `` < `` between frames) or, with ``verbose``, one line per frame."""
    out = [f"task {found.task}: {len(found.ranks)} rank(s)"] if found.ranks else []
    for r in sorted(found.ranks, key=lambda r: (r.node, r.rank if r.rank is not None else -1)):
        out.append(_head(r))
        if r.error:
            out.append(f"  cannot read it: {r.error}")
            continue
        for t in sorted(r.threads, key=lambda t: t.name != "MainThread"):
            mode = "active" if t.active else "idle"
            if not verbose:
                chain = " < ".join(f.short() for f in t.frames) or "(no Python frame)"
                out.append(f"  {t.name} ({mode}): {chain}")
                continue
            out.append(f"  thread {t.name} ({mode}{f', tid {t.os_id}' if t.os_id is not None else ''})")
            out += [f"    {f.function} ({f.path}:{f.line})" for f in t.frames] or ["    (no Python frame)"]
    if found.note:
        out.append(f"note: {found.note}")
    return out


def _head(r: RankStack) -> str:
    where = f"node {r.node}" + (f" ({r.host})" if r.host else "")
    return f"rank {r.rank if r.rank is not None else '?'} on {where}, pid {r.pid}:"
