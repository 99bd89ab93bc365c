"""Each local node's processes in a cgroup of their own (cgroup v2), so that stopping a job stops
every process it started: a worker's child that made its own session and emptied its environment
included, which neither a process group nor the ``DDPJOB_JOB_ID`` marker finds.

Layout: ``<the supervisor's cgroup>/ddpjob-<job id>/task-<i>-node-<n>``. The supervisor makes the
job's folder before its first node starts and records it in ``state.json`` (``cgroup``); each node
wrapper moves itself into its node's folder before it starts the agent, so everything below it is
inside (a process cannot leave a cgroup without write access to another). Stopping writes
``cgroup.kill`` (Linux 5.14+), or sends SIGKILL to each process listed, until none is left, then
removes the folders. Where there is no writable cgroup v2 (not root, cgroup v1 only), nothing is
made and ``make_job`` says why.

Standard library only: the supervisor and the node wrapper run as ``python -I -S``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from launcher.targets.shared.runfolder import node_tag

if TYPE_CHECKING:
    from launcher.targets.local.job.staterecord import StateRecord


def _mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on hybrid)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if "-" in fields and fields[fields.index("-") + 1] == "cgroup2":
                    return fields[4]
    except OSError:
        pass
    return None


def _own() -> str | None:
    """This process's cgroup v2 path (``0::/path`` in /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def make_job(job_id: str) -> tuple[str | None, str]:
    """The job's cgroup, made under this process's own; (None, why) where none can be made."""
    mount, own = _mount(), _own()
    if mount is None or own is None:
        return None, "this machine has no cgroup v2 hierarchy"
    path = os.path.join(mount, own.lstrip("/"), f"ddpjob-{job_id}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return None, f"cannot make a cgroup under {os.path.dirname(path)}: {e.strerror or e}"
    if not os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
        return None, f"cannot move processes into {path}"
    return path, ""


def node_dir(job: str, index: int, node: int) -> str | None:
    """The cgroup of node ``node`` of run ``index``, made now; None when it cannot be."""
    path = os.path.join(job, node_tag(index, node))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path


def enter(path: str) -> None:
    """Move this process into cgroup ``path`` (its children start there). Raises OSError."""
    with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as f:
        f.write(str(os.getpid()))


def pids(path: str) -> list[int]:
    """Every process in cgroup ``path`` and below it."""
    out: list[int] = []
    for folder, _, _ in os.walk(path):
        try:
            with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as f:
                out += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def stop(path: str, timeout: float = 5.0) -> list[int]:
    """Kill every process in cgroup ``path`` and below, then remove the folders. Returns the
    processes still there after ``timeout`` seconds ([] when the cgroup is gone or empty)."""
    if not os.path.isdir(path):
        return []
    deadline = time.monotonic() + timeout
    while True:
        left = pids(path)
        # An ended process counts until it is reaped (by init, for an orphan): wait for "populated 0".
        if (not left and not _populated(path)) or time.monotonic() > deadline:
            break
        try:
            with open(os.path.join(path, "cgroup.kill"), "w", encoding="ascii") as f:
                f.write("1")
        except OSError:  # before Linux 5.14: one by one (a cgroup's processes cannot leave it)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.05)
    remove(path)
    return left


def left_behind(path: str) -> str:
    """At the end of a job: stop what its processes left running in its cgroup (a daemon a worker started
    and its own session), remove the cgroups, and say what was stopped ("" when nothing was left)."""
    left = pids(path)
    names = []
    for pid in left[:5]:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                names.append(f"{pid} {f.read().strip()}")
        except OSError:
            names.append(str(pid))
    survivors = stop(path) if left else []
    remove(path)
    if not left:
        return ""
    more = f" and {len(left) - 5} more" if len(left) > 5 else ""
    still = f"; {len(survivors)} would not stop (pids {', '.join(map(str, survivors[:5]))})" if survivors else ""
    return (f"{len(left)} process(es) the job left running when it ended (pid {', '.join(names)}{more}) were "
            f"stopped with it{still}")


def _populated(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.events"), encoding="ascii") as f:
            return "populated 1" in f.read()
    except OSError:
        return False


def remove(path: str) -> bool:
    """Remove cgroup ``path`` and the ones below it that no process uses; True when all are gone."""
    for folder, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return not os.path.exists(path)


def remove_ended(job_id: str, state: StateRecord | None) -> str:
    """For a job that ended without its supervisor (killed), what the supervisor would have done at the
    end: stop what the job left running in its cgroup and remove the cgroups (``left_behind``); what was
    stopped, said ("" when nothing was)."""
    path = state.cgroup if state is not None else None
    if path is not None and path.endswith(f"/ddpjob-{job_id}") and os.path.isdir(path):
        return left_behind(path)
    return ""


def cancel_note(state: StateRecord | None) -> str | None:
    """What ``cancel`` says where no cgroup held the job (``state.json``'s ``cgroup_unavailable``)."""
    why = state.cgroup_unavailable if state is not None else None
    if not why:
        return None
    return (f"no cgroup held this job's processes ({why}): a process it started in a session of its own with an "
            "empty environment cannot be found, and may still run (look with ps)")
