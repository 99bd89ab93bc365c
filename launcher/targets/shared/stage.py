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
    # Three facts, each from its own file, so no line says one thing and waits on another: a node's
    # log means its process started; torchrun's attempt folder means the rendezvous gave every rank its
    # number and the workers were started; the first step comes from the metrics file (the progress line).
    if working == total:
        return f"{prefix}workers running on {total}/{total} node(s); waiting for the first step"
    if working:
        return f"{prefix}rendezvous done, ranks assigned; workers starting on {working}/{total} node(s)"
    if up == total:
        return f"{prefix}{total}/{total} node(s) started; their torchrun agents are meeting at the rendezvous"
    if up:
        return f"{prefix}{up}/{total} node(s) started; the rendezvous waits for the other {total - up}"
    return f"{prefix}starting {total} node(s)"
