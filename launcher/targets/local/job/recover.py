"""Bringing a local run back after one of its nodes is lost (the spec's ``recovery:``), for the supervisor.

A node is *lost* when ddpjob's node wrapper or its torchrun agent was killed from outside the job
(``rootcause.killed_process``): the other nodes' ranks fail only because a peer went away. The
supervisor then stops what is left of the run, keeps a record of the loss in ``state.json`` (the run's
``losses``: which node, when it was noticed, how, the step the ranks had reached, when the run was
started again and on how many nodes) and starts every node again, the lost one by a new process,
with ``DDPJOB_RESTART_COUNT`` set; the program resumes from its newest checkpoint. ``status`` reads the
records (``launcher.targets.shared.recovery``). Standard library only at module top, as the wing's rule
says, and no more of it than the supervisor's quick start loads anyway (``starts.py`` imports this module).
"""

from __future__ import annotations

import os
import time

RESTART_ENV = "DDPJOB_RESTART_COUNT"  # 1, 2, ... on each start after a loss; absent on the first


def lost_nodes(ended: list[tuple[int, int, int | None, str]]) -> list[tuple[int, str]]:
    """(node, how it was lost) of each of ``ended`` that was killed from outside the job; ``ended``:
    (node, wrapper pid, how the wrapper ended as its parent saw it, its exit file), read before ddpjob
    stopped any other node (its own SIGTERM is no loss)."""
    from launcher.targets.local.job.node import read_record
    from launcher.targets.shared.rootcause import killed_process

    lost = []
    for node, pid, code, exit_file in ended:
        how = killed_process(wrapper_pid=pid, wrapper_code=code, record=read_record(exit_file))
        if how is not None:
            lost.append((node, how))
    return lost


def reached_step(vitals_dir: str) -> int | None:
    """The furthest step the run's ranks reported (``DDPJOB_VITALS_DIR``, every 2 s), or None; their
    reports are removed, so that the restarted ranks' are not read beside a run that is gone."""
    import json  # here: the supervisor's way to its first nodes imports this module and no json

    steps = []
    try:
        names = os.listdir(vitals_dir)
    except OSError:
        return None
    for name in names:
        path = os.path.join(vitals_dir, name)
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(path, encoding="utf-8") as f:
                    step = json.load(f).get("step")
                if isinstance(step, int) and not isinstance(step, bool):
                    steps.append(step)
            except (OSError, ValueError, AttributeError):
                pass
        try:
            os.unlink(path)
        except OSError:
            pass
    return max(steps) if steps else None


def note_in_logs(logs: list[str], text: str) -> None:
    """A line in every node's log, where ``ddpjob logs`` shows it between the two starts."""
    line = f"[ddpjob] {text}\n".encode("utf-8", "replace")
    for log in logs:
        try:
            with open(log, "ab") as f:
                f.write(line)
        except OSError:
            pass  # a full disk: the loss is still recorded in state.json when it can be


def losses_text(lost: list[tuple[int, str]]) -> str:
    """``node 1 lost (its ...)`` for the run's message and logs."""
    return "; ".join(f"node {node} lost ({how})" for node, how in lost)


def record(lost: list[tuple[int, str]], *, noticed: float, reached: int | None) -> list[dict[str, object]]:
    """The losses' records as ``state.json`` keeps them, before the run is back."""
    return [{"node": node, "at": round(noticed, 3), "how": how, "reached_step": reached} for node, how in lost]


def back(records: list[dict[str, object]], *, nodes: int, restart: int) -> None:
    """The run started again: when, on how many nodes (the lost ones replaced), which start it is."""
    now = round(time.time(), 3)
    for rec in records:
        rec.update(back_at=now, nodes=nodes, restart=restart, replaced=True)
