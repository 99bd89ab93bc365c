"""Asking Slurm about jobs: sacct first, squeue and ``scontrol show job`` when accounting is off
or has not caught up. Every command has a timeout; parsing is pure and table-tested.

Records are keyed by native id: ``"123"`` for a plain job, ``"123_4"`` for array element 4.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass

from launcher.core.errors import TargetUnavailable
from launcher.core.states import JobState

# Every query answers within this many seconds in all (status, wait and cancel stay responsive
# when the controller is down).
COMMAND_TIMEOUT_S = 10.0

# Every Slurm job state (sacct/squeue/scontrol spellings) -> JobState. Anything else: UNKNOWN.
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SPECIAL_EXIT": JobState.FAILED,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,
}


def map_state(native: str) -> JobState:
    """``"CANCELLED by 0"``, ``"RUNNING"``, ``"completed"`` -> JobState; unknown text -> UNKNOWN."""
    word = native.strip().split(" ")[0].rstrip("+").upper() if native.strip() else ""
    return SLURM_STATES.get(word, JobState.UNKNOWN)


def held(native: str) -> bool:
    """Whether a job in this Slurm state still holds (or waits for) an allocation that scancel frees:
    pending or running, not completing (what is left there waits on the nodes, not on the job)."""
    word = native.strip().split(" ")[0].rstrip("+").upper() if native.strip() else ""
    return word != "COMPLETING" and map_state(word) in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True)
class SlurmRecord:
    """What Slurm says about one job or array element; ``started`` and ``ended``: when it started and, in
    a state that has ended, ended (seconds since the epoch: sacct's Start and End), None where not said."""

    native_id: str
    state: str
    nodes: str = ""
    exit_code: str = ""
    reason: str = ""
    source: str = ""
    started: float | None = None
    ended: float | None = None


# The time format every query asks for (SLURM_TIME_FORMAT=standard, whatever the user's own): 2026-11-28T10:00:00,
# in this machine's local time; Unknown, None or empty where Slurm does not know it yet.
_TIME_ENV = {"SLURM_TIME_FORMAT": "standard"}


def parse_time(text: str) -> float | None:
    """``2026-11-28T10:00:00`` (local time) -> seconds since the epoch; ``Unknown``, ``None``, '' -> None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _times(state: str, start: str, end: str) -> tuple[float | None, float | None]:
    """(started, ended) of a record: a start once it has left the queue (a pending job's is Slurm's
    guess), an end once it has ended (a live job's is its time limit)."""
    mapped = map_state(state)
    return (parse_time(start) if mapped is not JobState.PENDING else None,
            parse_time(end) if mapped.terminal else None)


_RANGE_ID = re.compile(r"^(\d+)_\[([0-9,\-]+)(%\d+)?\]$")


def expand_job_id(native: str) -> list[str]:
    """``"123_[2-4%2]"`` (a pending part of an array) -> ``["123_2", "123_3", "123_4"]``."""
    m = _RANGE_ID.match(native)
    if not m:
        return [native]
    out = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}_{n}" for n in range(int(lo), int(hi or lo) + 1)]
    return out


def parse_sacct(text: str) -> dict[str, SlurmRecord]:
    """``sacct -X -n -P -o JobID,State,ExitCode,NodeList,Reason,Start,End`` output (Start and End may be absent)."""
    out: dict[str, SlurmRecord] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 4 or not fields[0] or "." in fields[0]:
            continue
        reason, start, end = (fields[4:] + ["", "", ""])[:3]
        for nid in expand_job_id(fields[0]):
            out[nid] = SlurmRecord(nid, fields[1], fields[3], fields[2], reason, "sacct", *_times(fields[1], start, end))
    return out


def parse_squeue(text: str) -> dict[str, SlurmRecord]:
    """``squeue -h -r -t all -o %i|%T|%N|%r|%S|%e`` output (start and end time may be absent)."""
    out: dict[str, SlurmRecord] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 4 or not fields[0]:
            continue
        start, end = (fields[4:] + ["", ""])[:2]
        for nid in expand_job_id(fields[0].strip()):
            out[nid] = SlurmRecord(nid, fields[1].strip(), fields[2].strip(), "", fields[3].strip(), "squeue",
                                   *_times(fields[1], start, end))
    return out


def parse_scontrol(text: str) -> dict[str, SlurmRecord]:
    """``scontrol show job -o ID`` output: one line of KEY=VALUE per job or array element."""
    out: dict[str, SlurmRecord] = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        if "JobId" not in fields or "JobState" not in fields:
            continue
        array_id, task = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        if array_id and task:
            ids = expand_job_id(f"{array_id}_[{task}]") if not task.isdigit() else [f"{array_id}_{task}"]
        else:
            ids = [fields["JobId"]]
        nodes = fields.get("NodeList", "")
        for nid in ids:
            out[nid] = SlurmRecord(nid, fields["JobState"], "" if nodes == "(null)" else nodes,
                                   fields.get("ExitCode", ""), fields.get("Reason", ""), "scontrol",
                                   *_times(fields["JobState"], fields.get("StartTime", ""), fields.get("EndTime", "")))
    return out


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run a Slurm command (its times written as ``parse_time`` reads them); None when it times out."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              check=False, env={**os.environ, **_TIME_ENV})
    except FileNotFoundError as e:
        raise TargetUnavailable(f"{argv[0]} not found: the Slurm client commands must be on PATH") from e
    except subprocess.TimeoutExpired:
        return None
    return proc


class ControllerUnreachable(TargetUnavailable):
    """slurmctld did not answer (down, or the network between here and it): exit 3."""


def _unreachable(what: str, proc: subprocess.CompletedProcess[str] | None) -> ControllerUnreachable:
    why = "no answer within the time limit" if proc is None else (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return ControllerUnreachable(f"Slurm controller unreachable ({what}: {why}); the job's state is unknown "
                                 "from here, try again later (scontrol ping shows the controller)")


def query(job_ids: list[str], timeout: float = COMMAND_TIMEOUT_S,
          elements: dict[str, int] | None = None) -> dict[str, SlurmRecord]:
    """What Slurm knows about ``job_ids`` (plain or array job ids), in one call per source.

    sacct answers for every job it has in the database; jobs it does not know (accounting off,
    or slurmdbd lagging behind a fresh submission), arrays whose elements it does not all list
    (``elements``: array job id -> number of elements) and jobs still live are asked of the
    controller with squeue, then ``scontrol show job``. A job none of them knows is absent.

    Raises:
        ControllerUnreachable: the controller was needed (a job is live or unknown to sacct)
            and did not answer within ``timeout`` seconds in all (never a stale answer).
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    deadline = time.monotonic() + timeout
    records: dict[str, SlurmRecord] = {}
    # sacct is a help, not the truth for live jobs: give it at most half of the time.
    proc = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Reason,Start,End", "-j", ",".join(ids)],
                timeout / 2)
    if proc is not None and proc.returncode == 0:
        records.update(parse_sacct(proc.stdout))

    def known(jid: str) -> bool:
        return any(k == jid or k.startswith(jid + "_") for k in records)

    def complete(jid: str) -> bool:  # every element of an array, or the job itself
        count = (elements or {}).get(jid)
        return all(f"{jid}_{i}" in records for i in range(count)) if count else known(jid)

    # sacct may list some elements of an array and not others (one just cancelled, one running).
    missing = [j for j in ids if not complete(j)]
    live_ids = [j for j in ids if any(map_state(r.state) in (JobState.PENDING, JobState.RUNNING)
                                       for k, r in records.items() if k == j or k.startswith(j + "_"))]
    # sacct can lag behind the controller for running arrays (pending ranges, requeues): ask the
    # controller too for jobs that are still live, so states and pending reasons are current.
    ask = sorted(set(missing) | set(live_ids))
    if ask:
        proc = _run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%r|%S|%e", "-j", ",".join(ask)],
                    max(1.0, deadline - time.monotonic()))
        if proc is None or (proc.returncode != 0 and not _only_unknown_ids(proc.stderr)):
            raise _unreachable("squeue", proc)
        if proc.returncode == 0:
            records.update(parse_squeue(proc.stdout))
        for jid in [j for j in ask if not known(j)]:
            proc = _run(["scontrol", "show", "job", "-o", jid], max(1.0, deadline - time.monotonic()))
            if proc is None:
                raise _unreachable("scontrol", proc)
            if proc.returncode == 0:
                records.update(parse_scontrol(proc.stdout))
    return records


def _only_unknown_ids(stderr: str) -> bool:
    """squeue's complaint about job ids it no longer knows (purged): an answer, not an outage."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return bool(lines) and all("Invalid job id" in ln for ln in lines)


def queue_position(slurm_job_id: str) -> tuple[int, int] | None:
    """(1-based place, how many) of the job among the pending jobs, highest priority first (an
    array counts once), or None when squeue does not say."""
    proc = _run(["squeue", "-h", "-t", "PD", "--sort=-p,i", "-o", "%F"], timeout=10)
    if proc is None or proc.returncode != 0:
        return None
    order = list(dict.fromkeys(line.strip() for line in proc.stdout.splitlines() if line.strip()))
    base = slurm_job_id.split("_")[0]
    return (order.index(base) + 1, len(order)) if base in order else None
