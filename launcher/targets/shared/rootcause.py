"""The root cause of a failed node, read from what torchrun leaves behind; shared by the targets
whose nodes write files (local, Slurm).

Sources, best first: the agent's ``TORCHELASTIC_ERROR_FILE`` (torchrun copies the failed worker's
error file there when the worker used ``@record``), then torchrun's failure summary in the node
log ("Root Cause (first observed failure)" with rank and exit code), then the last lines the failed
worker wrote to stderr (``--log-dir``), then its last lines in the node log. A node that left none
of these (no summary, or no words of its own) on a disk with no room left failed of that full disk
(``full_disk``): its program, torchrun and ddpjob could not write why.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher.targets.shared.logtail import split_torchrun_prefix

_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
# Python 3.11+ underlines the failing expression of a traceback line with a line of only these:
# a pointer into code a one-line cause does not show, so no last words.
_MARKER_LINE = re.compile(r"^\s*[~^]+\s*$")


def _words(lines: list[str]) -> list[str]:
    """The lines that say something: no blank ones, no traceback marker lines (``^^^^``)."""
    return [ln for ln in lines if ln.strip() and not _MARKER_LINE.match(ln)]


def error_file_cause(path: str) -> str:
    """The message in a torchelastic error file, with the last line of its traceback; '' if none."""
    try:
        with open(path, encoding="utf-8") as f:
            err = json.load(f)
    except (OSError, ValueError):
        return ""
    message = err.get("message", err) if isinstance(err, dict) else err
    if isinstance(message, dict):
        text = str(message.get("message", "")).strip()
        extra = message.get("extraInfo", {})
        trace = extra.get("py_callstack", "") if isinstance(extra, dict) else ""
        last = [ln.strip() for ln in str(trace).strip().splitlines() if ln.strip()][-1:]
        return text + (f" ({last[0]})" if last and last[0] not in text else "")
    return str(message)


def torchrun_failures(lines: list[str]) -> list[tuple[int | None, int | None]]:
    """(local rank, exit code) of every failed worker in torchrun's last summary, its "Root Cause
    (first observed failure)" first, then the others ("Failures:") in their order; [] if none."""
    start = max((i for i, ln in enumerate(lines) if "Root Cause (first observed failure)" in ln), default=None)
    if start is None:
        return []
    head = lines[start : start + 12]
    root = (next((int(m.group(2)) for m in map(_RANK.search, head) if m), None),
            next((int(m.group(1)) for m in map(_EXIT.search, head) if m), None))
    begin = max((i for i, ln in enumerate(lines[:start]) if ln.rstrip().endswith("Failures:")), default=start)
    others: list[tuple[int | None, int | None]] = []
    for ln in lines[begin:start]:  # each failure's rank line, then its exit code's
        if rank := _RANK.search(ln):
            others.append((int(rank.group(2)), None))
        elif (code := _EXIT.search(ln)) and others and others[-1][1] is None:
            others[-1] = (others[-1][0], int(code.group(1)))
    return [root, *(o for o in others if o[0] != root[0])]


def stderr_tail(torchrun_log_dir: str, local_rank: int | None, n: int = 3) -> list[str]:
    """Last lines of a worker's stderr from torchrun's ``--log-dir`` (newest attempt)."""
    if local_rank is None:
        return []
    files = sorted(Path(torchrun_log_dir).glob(f"*/attempt_*/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    if not files:
        return []
    lines = [split_torchrun_prefix(ln)[1] for ln in files[-1].read_text(encoding="utf-8", errors="replace").splitlines()]
    return _words(lines)[-n:]


def node_failure(*, node: int, procs_per_node: int, log: str, error_file: str, torchrun_log_dir: str) -> str:
    """One line saying which rank failed, how, and its last words."""
    cause = error_file_cause(error_file)
    if cause:
        return cause
    try:
        lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    failed = torchrun_failures(lines) or [(None, None)]
    local_rank, exitcode, tail = *failed[0], _last_words(lines, torchrun_log_dir, failed[0][0])
    if _PEER_ERRORS.search(" ".join(tail)):
        # torchrun's "first observed" failure is a tie within a second, broken by local rank: a rank
        # that died of a peer's departure can stand before the one on this node that raised its own.
        for other, code in failed[1:]:
            said = _last_words(lines, torchrun_log_dir, other)
            if said and not _PEER_ERRORS.search(" ".join(said)):
                local_rank, exitcode, tail = other, code, said
                break
    rank = node * procs_per_node + local_rank if local_rank is not None else None
    own = agent_error(lines) if rank is None else None
    if own is not None:  # torchrun itself failed: its error, not a worker's lines, is the cause
        when = "" if any(lr is not None for lr, _ in map(split_torchrun_prefix, lines)) else " before any rank started"
        return f"node {node}: torchrun failed{when}: {own}"
    if rank is None:
        head = f"node {node} failed"
    elif exitcode is not None and exitcode < 0:
        head = f"rank {rank} was killed by {signal_name(-exitcode)}"
    else:
        head = f"rank {rank} exited with code {exitcode}"
    words = " | ".join(t.strip() for t in tail)
    # No summary from torchrun, or no words from the rank: on a full disk, because they could not be written.
    full = full_disk(log) if rank is None or not tail else None
    if full:
        return f"{head}: {full}" + (f" (its last lines: {words})" if words else "")
    return head + (f": {words}" if words else "")


def _last_words(lines: list[str], torchrun_log_dir: str, local_rank: int | None) -> list[str]:
    """A failed worker's last three lines: from its stderr under torchrun's ``--log-dir``, else its
    lines in the node log (every worker's when the rank is not known)."""
    tail = stderr_tail(torchrun_log_dir, local_rank)
    if not tail:
        worker = [t for lr, t in map(split_torchrun_prefix, lines) if lr is not None and (local_rank is None or lr == local_rank)]
        tail = _words(worker)[-3:]
    return tail


# Less room than this for a file of the user's (a node's log, a traceback, a checkpoint): the disk is full.
FULL_BELOW = 1 << 20


def full_disk(path: str) -> str | None:
    """``the disk is full (/data: 12 KiB free), so the node's output and errors could not be written;
    free some space (ddpjob prune removes old jobs' folders)`` when the filesystem that holds ``path``
    has less than ``FULL_BELOW`` bytes, or no file entry (inode), left for a write of its owner's (root
    may use the blocks a filesystem keeps back); None otherwise, or where it cannot be told."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fs = os.statvfs(folder)
    except OSError:
        return None
    root = os.geteuid() == 0
    free = (fs.f_bfree if root else fs.f_bavail) * fs.f_frsize
    if free < FULL_BELOW:
        what = f"the disk is full ({_mount_point(folder)}: {free // 1024} KiB free)"
    elif fs.f_files and not (fs.f_ffree if root else fs.f_favail):
        what = f"the disk has no free file entries (inodes) left ({_mount_point(folder)})"
    else:
        return None
    return what + ", so the node's output and errors could not be written; free some space (ddpjob prune removes old jobs' folders)"


def _mount_point(folder: str) -> str:
    """The folder where the filesystem holding ``folder`` is mounted (``folder`` itself if unknown)."""
    try:
        dev = os.stat(folder).st_dev
        while (parent := os.path.dirname(folder)) != folder and os.stat(parent).st_dev == dev:
            folder = parent
    except OSError:
        pass
    return folder


# The exceptions torchrun raises because of its workers or a signal: consequences, not its own error.
_AGENT_CONSEQUENCES = ("ChildFailedError", "SignalException")


def agent_error(lines: list[str]) -> str | None:
    """The exception that ended torchrun itself (the last line of its own last traceback, e.g.
    ``ValueError: Unknown level: 'debug'`` for ``LOGLEVEL=debug``), or its usage error; None when it
    has none, or raised only because a worker failed or a signal came."""
    own = [ln for lr, ln in map(split_torchrun_prefix, lines) if lr is None]
    starts = [i for i, ln in enumerate(own) if ln.startswith("Traceback (most recent call last):")]
    if starts:
        for ln in own[starts[-1] + 1:]:
            if ln.strip() and not ln[0].isspace():
                return None if any(c in ln for c in _AGENT_CONSEQUENCES) else ln.strip()
        return None
    usage = [ln.strip() for ln in own if re.match(r"^(torchrun|\S+\.py): error: ", ln)]
    return usage[-1] if usage else None


def own_error(log: str) -> str | None:
    """``agent_error`` of the last 64 KiB of a node's log (where torchrun's last traceback is)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            return agent_error(f.read().decode("utf-8", "replace").splitlines())
    except OSError:
        return None


class NodeEnd(Protocol):
    """A node as its run's record keeps it (the local supervisor's ``staterecord.StateNode``)."""

    node: int
    exit_code: int | None
    error: str | None


def own_errors(records: Sequence[NodeEnd], logs: list[str], failed: int, message: str) -> str:
    """``message`` (the cause, on node ``failed``), saying which other nodes failed the same way. A
    spec torchrun rejects fails every node alike, and the SIGTERM that stops the others may reach
    one as it exits: such a node's ``records`` entry gets its own ``error``, not only the exit code
    of the stop."""
    same = []
    for rec, log in zip(records, logs):
        if rec.node == failed or rec.exit_code in (None, 0):
            continue
        error = own_error(log)
        if error is not None:
            rec.error = error
            if error in message:
                same.append(str(rec.node))
    return message + (f" (node{'s' if len(same) > 1 else ''} {', '.join(same)} failed the same way)" if same else "")


def killed_node(*, node: int, nodes: int, wrapper_pid: int | None, wrapper_code: int | None,
                record: dict[str, object] | None) -> str | None:
    """Which process of a local node was killed from outside the job, how, and what followed; None
    when neither was (the node failed on its own: ``node_failure`` says how).

    ``wrapper_code``: how ddpjob's node wrapper ended as its parent saw it (negative: killed by that
    signal; None: unknown); ``record``: the wrapper's exit record of its torchrun agent
    (``launcher.targets.local.job.node``). A killed agent leaves no failure summary, only its workers'
    ordinary lines, and a killed wrapper's agent is stopped by ddpjob's own SIGTERM afterwards:
    neither is the cause."""
    others = " and the job's other nodes" if nodes > 1 else ""
    if record is not None and isinstance(record.get("stalled"), str):  # the stall watch ended it (stall.action: fail)
        return f"stalled: {record['stalled']}; ddpjob stopped the job (stall.action: fail)"
    how = killed_process(wrapper_pid=wrapper_pid, wrapper_code=wrapper_code, record=record)
    if how is None:
        return None
    then = "its torchrun agent" if how.startswith("its ddpjob node wrapper") else "its workers"
    return f"node {node}: {how}; ddpjob then stopped {then}{others}"


def killed_process(*, wrapper_pid: int | None, wrapper_code: int | None, record: dict[str, object] | None) -> str | None:
    """How a local node was lost: ``its ddpjob node wrapper (pid 12) was killed by SIGKILL ...`` or the
    same of its torchrun agent; None when neither was killed from outside (or the stall watch ended it,
    which ``killed_node`` tells apart). Arguments as ``killed_node``'s."""
    if record is not None and isinstance(record.get("stalled"), str):
        return None
    if wrapper_code is not None and wrapper_code < 0 and (record is None or record.get("exit_code") is None):
        pid = f" (pid {wrapper_pid})" if wrapper_pid else ""
        return f"its ddpjob node wrapper{pid} {_killed(signal_name(-wrapper_code))}"
    sig = record.get("signal") if record else None
    if record is not None and isinstance(sig, str) and sig:
        agent = record.get("pid")
        pid = f" (pid {agent})" if isinstance(agent, int) else ""
        return f"its torchrun agent{pid} {_killed(sig)}"
    return None


def _killed(sig: str) -> str:
    if sig == "SIGKILL":
        return "was killed by SIGKILL from outside the job (the OOM killer, or a user)"
    if sig in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"):
        return f"was killed by {sig} from outside the job"
    return f"died of {sig}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# A rank that fails because a peer went away is a consequence, never the root cause.
_PEER_ERRORS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|connectFullMesh|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(?:abort|timeout)|DistBackendError|"
    r"killed by SIG(?:TERM|KILL|HUP|INT)|exited with code -(?:15|9)\b|Signal 15|SIGTERM",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class NodeFailure:
    """A failed node's files and, where known, when it ended (seconds since the epoch)."""

    node: int
    log: str
    error_file: str
    torchrun_log_dir: str
    ended: float | None = None


def first_failure(failures: list[NodeFailure], procs_per_node: int) -> tuple[NodeFailure, str, list[int]]:
    """The root cause among failed nodes: a node whose error is its own (not a peer's departure)
    before one that failed because of it, then the earliest by time (the error file's timestamp,
    the worker's last stderr write, the node's end). Returns (that node, its cause, the other
    failed nodes, which died after it)."""
    ranked = []
    for f in failures:
        cause = node_failure(node=f.node, procs_per_node=procs_per_node, log=f.log, error_file=f.error_file,
                             torchrun_log_dir=f.torchrun_log_dir)
        ranked.append((bool(_PEER_ERRORS.search(cause)), _failure_time(f), f.node, f, cause))
    ranked.sort(key=lambda r: (r[0], r[1], r[2]))
    _, _, _, first, cause = ranked[0]
    return first, cause, [r[2] for r in ranked[1:]]


def first_and_after(failures: list[NodeFailure], procs_per_node: int) -> tuple[int, str]:
    """The node that failed first (``first_failure``) and its cause, naming the nodes that failed
    after it: ``rank 1 exited with code 1: ... (then node(s) 0 failed after it)``. Nodes whose
    torchrun failed with the first one's own error are left to ``own_errors`` (the same way)."""
    first, cause, after = first_failure(failures, procs_per_node)
    mine, logs = own_error(first.log), {f.node: f.log for f in failures}
    after = [n for n in after if mine is None or own_error(logs[n]) != mine]
    return first.node, cause + (f" (then node(s) {', '.join(map(str, after))} failed after it)" if after else "")


def _failure_time(f: NodeFailure) -> float:
    times = [t for t in (_error_file_time(f.error_file), _stderr_time(f.torchrun_log_dir), f.ended) if t]
    return min(times) if times else float("inf")


def _error_file_time(path: str) -> float | None:
    try:
        with open(path, encoding="utf-8") as fh:
            err = json.load(fh)
        return float(err["message"]["extraInfo"]["timestamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stderr_time(torchrun_log_dir: str) -> float | None:
    """When a worker of the node last wrote to stderr (its traceback, for a failed worker)."""
    times = [p.stat().st_mtime for p in Path(torchrun_log_dir).glob("*/attempt_*/*/stderr.log") if p.stat().st_size]
    return max(times) if times else None
