"""Bringing a Slurm run back after it loses a node (the spec's ``recovery:``), inside the job: what is
Slurm's own beside the runners' shared core (``shared/restarts.py``: ``Recovery``, ``kill_tree``).

The first node's runner hears every other node's heartbeats (``launcher.targets.shared.heartbeat``). A
node heard from before and then not for ``recovery.lost_after`` seconds is *lost*: its machine, its
slurmd, its runner or its link is gone. Then, within the budget (``max_losses``) and while at least
``min_nodes`` remain, the first node's runner:

1. records the loss in the run's ``recovery.json`` (``TaskFolder.recovery``): which node, when, how it
   was noticed, how many nodes the run goes on with;
2. stops its own torchrun and its workers (they wait in a collective for the lost peer), and drops the
   node from the Slurm job (``scontrol update JobId=J NodeList=<the others>``): Slurm holds no
   allocation for it any more, and the node is free for other jobs once it is back;
3. starts its torchrun again for the nodes left (``--nnodes`` their number, ``DDPJOB_RESTART_COUNT``
   the start's number) and answers every heartbeat with that start (``{"restart": n, "members":
   [node ids]}``): each other node's runner stops its torchrun and starts it again with its rank among
   the members. The program resumes from its checkpoint on the smaller world size.

A node that hears nothing from the first node for ``lost_after`` stops its ranks, and the lowest
other member takes the first node's place (``elect``): it listens on its own address, and if the
members it hears, itself included, are more than half the run's, it starts the run again with them as
its first node (the others send their heartbeats to it). A first node that hears half the run or less
at once leaves (it is more likely cut off than they all lost), so one side of a split goes on, never
two. A node that hears no one, or is told it is no longer a member, leaves the run with exit code 0:
srun's ``--kill-on-bad-exit`` must not end the others if its link comes back. The job is submitted
with ``--no-kill``, so Slurm keeps it when it declares a lost node down (the batch host included:
Slurm refuses to drop that one from a running job before).

srun waits for every task it started, the lost node's too, and a task where Slurm cannot reach ends
for srun only when the node is declared down (SlurmdTimeout, 5 minutes by default). So once a run that
lost nodes has ended, the first node's runner waits for the members to record their end and cancels
the step. Slurm then records the job as FAILED or CANCELLED; ``ddpjob status`` reads the outcome in
``recovery.json`` (``launcher.targets.slurm.status``).

A run whose first node (the batch host, which runs srun) was lost ends with its new first node
cancelling the whole job: the batch script cannot end it.

Standard library only, as every module of ``job/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import BinaryIO

from launcher.targets.shared.files import read_json, write_json
from launcher.targets.shared.heartbeat import INTERVAL_S, Beacon, Watch
from launcher.targets.shared.restarts import Recovery
from launcher.targets.shared.runfolder import TaskFolder

END_WAIT_S = 60.0  # how long the first node waits for the members to record their end
ELECT_S = 4 * INTERVAL_S  # how long the node taking a lost first node's place listens for the others


def elect(recovery: Recovery, heartbeat: Watch | Beacon | None, lead: Callable[[], Watch | Beacon | None],
          address_of: Callable[[int], str | None], own: str, log: BinaryIO) -> tuple[Watch | Beacon | None, str]:
    """The first node is lost (``recovery.electing``): take its place (the lowest other member), or
    follow the node that does. Returns this node's heartbeats and the run's rendezvous address from now."""
    assert recovery.electing is not None
    cand, why = recovery.electing["candidate"], recovery.electing["why"]
    if cand != recovery.node:
        addr = address_of(cand)
        if addr is None or not isinstance(heartbeat, Beacon):
            recovery.cut(f"{why}; node {cand} ({recovery.host(cand)}) has no address known here")
            return heartbeat, own
        log.write(f"[ddpjob] {why}: node {cand} ({recovery.host(cand)}, {addr}) is to take the first node's "
                  "place; following it\n".encode())
        heartbeat.follow(addr)
        recovery.decided(recovery.lost_after + 3 * INTERVAL_S)
        return heartbeat, addr
    if heartbeat is not None:
        heartbeat.stop()
    log.write(f"[ddpjob] {why}: this node takes the first node's place if it hears more than half the run's "
              f"nodes within {ELECT_S:g} s\n".encode())
    watch = lead()
    heard: set[int] = set()
    if isinstance(watch, Watch):
        others = set(recovery.members) - {recovery.first, recovery.node}
        deadline = time.monotonic() + ELECT_S
        while True:
            heard = {n for n, r in watch.nodes.items() if r.get("heard") and n != recovery.node and not r.get("dropped")}
            if others <= heard or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    recovery.elect(heard)
    return watch, own


def shrink(recovery: Recovery) -> str:
    """Drop the nodes that are no longer members from the Slurm job; what happened, for the log."""
    jid = os.environ.get("SLURM_JOB_ID", "")
    scontrol = shutil.which("scontrol")
    kept = [recovery.host(m) for m in recovery.members]
    batch = "" if 0 in recovery.members else (
        f"Slurm keeps node 0 ({recovery.host(0)}, the batch host) in the job until it declares it down (it refuses "
        "to drop the batch host from a running job; with --no-kill the job goes on without it)")
    if batch:
        kept.insert(0, recovery.host(0))
        if {0, *recovery.members} == set(range(recovery.nodes)):  # no other node to drop
            return batch
    keep = ",".join(kept)
    if not jid or not scontrol:
        return "no scontrol on this node: Slurm keeps the lost node's allocation until the job ends"
    import tempfile

    try:
        # scontrol writes slurm_job_<id>_resize.sh/.csh (to update a shell's variables) where it runs:
        # not in the user's workdir.
        with tempfile.TemporaryDirectory(prefix="ddpjob-resize-") as cwd:
            proc = subprocess.run([scontrol, "update", f"JobId={jid}", f"NodeList={keep}"], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=30, check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol update JobId={jid} NodeList={keep} failed: {exc}"
    if proc.returncode != 0:
        return f"scontrol update JobId={jid} NodeList={keep} failed: {proc.stderr.strip() or proc.returncode}"
    return f"Slurm job {jid} now holds {keep} only" + (f"; {batch}" if batch else "")


def finish(recovery: Recovery, record: dict[str, object], paths: dict[str, str], code: int,
           task: TaskFolder) -> tuple[dict[str, object], str | None]:
    """The end of a node's part in a run with recovery: it left the run, the run could not go on, or
    the run ended after losing nodes (the first node then records how and ends the step). Returns the
    runner's result and why it failed (None when it did not)."""
    result: dict[str, object] = {"node": recovery.node, "host": record["host"], "exit_code": code}
    if recovery.leave:  # exit 0: srun --kill-on-bad-exit must not end the others if this node comes back
        record.update(state="left", left=recovery.leave)
        record.pop("exit_code", None)  # its torchrun's, killed as it left: not how the node ended
        write_json(paths["record"], record)
        with open(paths["log"], "ab", buffering=0) as log:
            log.write(f"[ddpjob] {recovery.leave}\n".encode())
        if recovery.leads and not _taken_over(recovery):  # the first node left, and no one took its place
            failed = f"{recovery.leave}; no other node took its place within {takeover_wait(recovery):g} s"
            recovery.write(outcome="failed", reason=failed, ended=time.time())
            end_allocation(paths["log"])
            return result, failed
        return {**result, "left": recovery.leave}, None
    if recovery.failed:
        record.update(error=recovery.failed)
        write_json(paths["record"], record)
        recovery.write(outcome="failed", reason=recovery.failed, ended=time.time())
        end_allocation(paths["log"])
        return result, recovery.failed
    write_json(paths["record"], record)
    failure = (f"torchrun on node {recovery.node} ({record['host']}) exited with code {code}; see {paths['log']}"
               if code != 0 else None)
    if not recovery.leads:
        return result, failure
    wait_members(task, recovery)
    recovery.write(outcome="succeeded" if code == 0 else "failed", exit_code=code, ended=time.time())
    if recovery.first != 0:  # the batch host is lost: its script cannot end the job
        end_allocation(paths["log"], "the run has ended and its batch host (node 0) is lost")
        return result, failure
    with open(paths["log"], "ab", buffering=0) as log:
        end_step(log)
    return result, failure


def takeover_wait(recovery: Recovery) -> float:
    """How long a first node that left waits for another to take its place: the others notice it
    silent within ``lost_after`` and a few heartbeats of it, then listen ``ELECT_S``."""
    return recovery.lost_after + 4 * INTERVAL_S + ELECT_S + 10


def _taken_over(recovery: Recovery) -> bool:
    """Whether another node took this first node's place (the run's record names another first)."""
    deadline = time.monotonic() + takeover_wait(recovery)
    while time.monotonic() < deadline:
        rec = read_json(recovery.path) if recovery.path else None
        if isinstance(rec, dict) and rec.get("first") not in (None, recovery.node):
            return True
        time.sleep(1.0)
    return False


def wait_members(task: TaskFolder, recovery: Recovery) -> None:
    """Wait (up to ``END_WAIT_S``) until every other member recorded the end of its last start."""
    deadline = time.monotonic() + END_WAIT_S
    others = [m for m in recovery.members if m != recovery.node]
    while others and time.monotonic() < deadline:
        recs = [read_json(task.record(m)) for m in others]
        if all(isinstance(r, dict) and r.get("state") != "running" and r.get("start", 0) == recovery.restart
               for r in recs):
            return
        time.sleep(0.5)


def end_step(log: BinaryIO) -> None:
    """Cancel this job step (a run that lost nodes has ended): srun would wait for the lost node's task."""
    jid, step = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_STEP_ID", "")
    scancel = shutil.which("scancel")
    if not jid or not step or not scancel:
        log.write(b"[ddpjob] no scancel here: ddpjob cancel ends the job step that waits for the lost node\n")
        return
    log.write(f"[ddpjob] the run has ended; cancelling step {jid}.{step}, which waits for the lost node(s)\n".encode())
    try:
        subprocess.run([scancel, f"{jid}.{step}"], stdin=subprocess.DEVNULL, capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def end_allocation(log_path: str, why: str = "stall.action fail") -> None:
    """The stall watch ended this run (stall.action: fail), or the run cannot end its job otherwise:
    cancel its Slurm job so that the allocation is freed now. Without it Slurm keeps the job RUNNING while it waits for a node that is
    cut off (srun waits for every task). Said in the node's log; a node without scancel (a container
    without Slurm's commands) leaves it to ``ddpjob cancel``.

    The line is written before scancel runs: the cancel signals this step's processes, scancel among
    them (it is this task's child), so scancel may end by SIGTERM with the cancel done, and this runner
    may not get to write afterwards. Only a scancel that exits non-zero by itself failed."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    jid = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
    scancel = shutil.which("scancel")
    with open(log_path, "ab", buffering=0) as log:
        if not jid or not scancel:
            log.write(f"[ddpjob] {why}: no scancel on this node: ddpjob cancel frees the allocation\n".encode())
            return
        log.write(f"[ddpjob] {why}: cancelling Slurm job {jid} to free its allocation\n".encode())
        try:
            proc = subprocess.run([scancel, jid], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=15, check=False)
            # < 0: ended by the cancel's own signal, which reached this step: not a failure
            failed = (proc.stderr.strip() or f"exit code {proc.returncode}") if proc.returncode > 0 else None
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed = str(exc)
        if failed:
            log.write(f"[ddpjob] scancel {jid} failed: {failed}; ddpjob cancel frees the allocation\n".encode())
