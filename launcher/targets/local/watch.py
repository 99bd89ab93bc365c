"""The local target's side of the stall watch and the ranks' vitals (``launcher.targets.shared.heartbeat``,
``shared.vitals``): what each node wrapper is told in its plan (``DDPJOB_WATCH``, read and removed by
``launcher.targets.local.job.node`` before its agent starts), and what ``status`` reads back from the first
node's ``task-<i>/watch.json``. A node in a container (local.container) is watched the same way: its
wrapper runs on this machine outside the container and finds the container's torchrun agent in
``/proc`` by the container's name (the engine runs it on this machine's kernel), see
``launcher.targets.local.job.node``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from launcher.targets.local.job.node import WATCH_ENV
from launcher.targets.shared.runfolder import RunFolder, TaskFolder
from launcher.targets.shared.vitals import VITALS_DIR_ENV

if TYPE_CHECKING:
    from launcher.spec.model import JobSpec
    from launcher.targets.local.job.staterecord import StateRecord


def node_env(spec: JobSpec, *, task: TaskFolder, node: int, container: str | None = None) -> dict[str, str]:
    """The variables that give node ``node`` its watch (the first node) or beacon (the others). The
    node wrapper finds the rest where it is: the rendezvous address and port in its torchrun command
    (as moved, if it was), its log and ``watch.json`` beside its exit record, the run's metrics file
    in ``DDPJOB_METRICS_FILE``; ``container``: the name of the node's container, if it has one."""
    watch = f"node={node} nodes={spec.nodes} timeout={spec.stall.timeout_s} action={spec.stall.action}"
    return {WATCH_ENV: watch + (f" container={container}" if container else ""), VITALS_DIR_ENV: task.vitals}


def container_env(env: dict[str, str]) -> list[str]:
    """The names of ``env`` a node's container gets: all but the watch's, which is its wrapper's."""
    return [name for name in env if name != WATCH_ENV]


def running_note(run_dir: str, state: StateRecord, message: str) -> str:
    """``message`` with what the watch of each running run says (a stuck rank, a straggler), if anything."""
    from launcher.targets.shared.heartbeat import report

    notes = []
    for el in state.elements:
        if el.state != "RUNNING":
            continue
        watch = RunFolder(run_dir).task(el.index).read_watch()
        note = report(watch, time.time()) if watch is not None else None
        if note:
            el.message = note
            notes.append(note if len(state.elements) == 1 else f"task {el.index}: {note}")
    return "; ".join([message, *notes] if message else notes)
