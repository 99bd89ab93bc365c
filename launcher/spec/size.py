"""How much work a spec may describe: nodes x processes per node x runs, bounded before any plan is made.

A valid 5 KB spec can name 1,000 runs of 1,024 nodes; planning and printing that costs gigabytes.
``size_issues`` refuses more than ``MAX_PROCESSES`` (16,384: 1,024 nodes x 8 GPUs x 2 runs) at
once, from the spec alone; the service checks the plan's exact count again (``procs_per_node: auto``
is the GPU count, known only to the target). There is no switch past it: more is several jobs.
"""

from __future__ import annotations

import math

from launcher.core.errors import Issue

MAX_PROCESSES = 16_384


def work_issue(nodes: int, procs_per_node: int, runs: int) -> Issue | None:
    """An ``Issue`` when ``nodes x procs_per_node x runs`` passes ``MAX_PROCESSES``, else None."""
    total = nodes * procs_per_node * runs
    if total <= MAX_PROCESSES:
        return None
    where = ("sweep",) if runs > 1 else ("nodes",)
    return Issue(where, f"the job describes {total:,} processes ({nodes:,} node(s) x {procs_per_node:,} process(es)"
                 f"{f' x {runs:,} runs' if runs > 1 else ''}); at most {MAX_PROCESSES:,} are allowed in one job",
                 hint="split the sweep into several jobs (each its own spec or --set sweep...), or use fewer nodes")


def size_issues(nodes: int, procs_per_node: int | str, gpus: int, sweep_sizes: list[int]) -> list[Issue]:
    """The limit checked from a spec's fields; ``procs_per_node: auto`` counts as the spec's GPUs (at least 1)."""
    ppn = procs_per_node if isinstance(procs_per_node, int) else max(1, gpus)
    issue = work_issue(nodes, ppn, math.prod(sweep_sizes))
    return [issue] if issue else []
