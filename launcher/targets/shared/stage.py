"""Where a job is on its way to its first step, read from the files its nodes write: a node's log
exists once its torchrun agent runs; torchrun makes ``<its log dir>/<run id>/attempt_<n>/`` when
the rendezvous is complete and it starts the workers. Shared by the targets whose node files this
machine can read (local, Slurm on a shared filesystem)."""

from __future__ import annotations

import glob
import os

NodeFiles = tuple[str, str]  # (the node's log, its torchrun --log-dir)


def startup_stage(runs: list[list[NodeFiles]]) -> str | None:
    """One line about the latest run that has started a node (the first run before any), or None
    when there is nothing to say."""
    if not runs or not any(runs):
        return None
    started = [nodes for nodes in runs if any(os.path.exists(log) for log, _ in nodes)]
    nodes = started[-1] if started else runs[0]
    prefix = f"task {runs.index(nodes)}: " if len(runs) > 1 else ""
    total = len(nodes)
    up = sum(os.path.exists(log) for log, _ in nodes)
    working = sum(bool(glob.glob(os.path.join(glob.escape(folder), "*", "attempt_*"))) for _, folder in nodes)
    if working == total:
        return f"{prefix}workers running on {total}/{total} node(s); no step reported yet"
    if working:
        return f"{prefix}rendezvous done; workers starting ({working}/{total} node(s))"
    if up:
        return f"{prefix}rendezvous: {up}/{total} node(s) up, waiting for every node to join"
    return f"{prefix}starting the nodes"
