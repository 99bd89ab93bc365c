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

A node that hears nothing from the first node for ``lost_after`` stops its ranks and leaves the run,
and so does a node that is told it is no longer a member. It leaves with exit code 0: srun's
``--kill-on-bad-exit`` must not end the others if its link comes back.

srun waits for every task it started, the lost node's too, and a task where Slurm cannot reach ends
for srun only when the node is declared down (SlurmdTimeout, 5 minutes by default). So once a run that
lost nodes has ended, the first node's runner waits for the members to record their end and cancels
the step. Slurm then records the job as FAILED or CANCELLED; ``ddpjob status`` reads the outcome in
``recovery.json`` (``launcher.targets.slurm.status``).

Not brought back (yet): the first node itself (the batch host, which runs srun); the others stop their
ranks when they stop hearing it, and Slurm ends the job when it declares the node down.

Standard library only, as every module of ``job/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from launcher.targets.shared.files import read_json, write_json
from launcher.targets.shared.restarts import Recovery
from launcher.targets.shared.runfolder import TaskFolder

END_WAIT_S = 60.0  # how long the first node waits for the members to record their end


def shrink(recovery: Recovery) -> str:
    """Drop the nodes that are no longer members from the Slurm job; what happened, for the log."""
    jid = os.environ.get("SLURM_JOB_ID", "")
    scontrol = shutil.which("scontrol")
    keep = ",".join(recovery.host(m) for m in recovery.members)
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
    return f"Slurm job {jid} now holds {keep} only"


def finish(recovery: Recovery, record: dict[str, Any], paths: dict[str, str], code: int,
           task: TaskFolder) -> tuple[dict[str, Any], str | None]:
    """The end of a node's part in a run with recovery: it left the run, the run could not go on, or
    the run ended after losing nodes (the first node then records how and ends the step). Returns the
    runner's result and why it failed (None when it did not)."""
    result: dict[str, Any] = {"node": recovery.node, "host": record["host"], "exit_code": code}
    if recovery.leave:  # exit 0: srun --kill-on-bad-exit must not end the others if this node comes back
        record.update(state="left", left=recovery.leave)
        record.pop("exit_code", None)  # its torchrun's, killed as it left: not how the node ended
        write_json(paths["record"], record)
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
    if recovery.node != 0:
        return result, failure
    wait_members(task, recovery)
    recovery.write(outcome="succeeded" if code == 0 else "failed", exit_code=code, ended=time.time())
    with open(paths["log"], "ab", buffering=0) as log:
        end_step(log)
    return result, failure


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


def end_step(log: Any) -> None:
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


def end_allocation(log_path: str) -> None:
    """The stall watch ended this run (stall.action: fail): cancel its Slurm job so that the
    allocation is freed now. Without it Slurm keeps the job RUNNING while it waits for a node that is
    cut off (srun waits for every task). Said in the node's log; a node without scancel (a container
    without Slurm's commands) leaves it to ``ddpjob cancel``."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    jid = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
    scancel = shutil.which("scancel")
    if not jid or not scancel:
        note = "no scancel on this node: ddpjob cancel frees the allocation"
    else:
        try:
            proc = subprocess.run([scancel, jid], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=15, check=False)
            note = f"cancelled Slurm job {jid} to free its allocation" if proc.returncode == 0 else \
                f"scancel {jid} failed: {proc.stderr.strip()}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            note = f"scancel {jid} failed: {exc}"
    with open(log_path, "ab", buffering=0) as log:
        log.write(f"[ddpjob] stall.action fail: {note}\n".encode())
