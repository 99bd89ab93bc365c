"""Process helpers for targets that run processes on this machine (Linux /proc).

Guard against PID reuse: a pid is "ours" only if its start time matches what we recorded.
Find a job's processes by the ``DDPJOB_JOB_ID`` marker in their environment as well as by
parentage: torchrun starts each worker in a new session, and a worker whose agent died is
re-parented to init, so neither a process group nor the parent chain finds every one of them.
"""

from __future__ import annotations

import os
import signal
import time


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def alive(pid: int, started: int | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when ``started`` is given, is the same process."""
    st = _state(pid)
    if st is None or st in ("Z", "X"):
        return False
    return started is None or start_time(pid) == started


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def marked_pids(name: str, value: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``name=value``, except this one."""
    marker = f"{name}={value}".encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            if pid != me and _environ_has(pid, marker) and alive(pid):
                out.append(pid)
    return out


def terminate(pids_with_start: list[tuple[int, int | None]], grace: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds, each process still ours. Returns survivors."""
    targets = [(p, s) for p, s in pids_with_start if alive(p, s)]
    for pid, _ in targets:
        try:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)  # a stopped process would hold the SIGTERM until the SIGKILL
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p, s) for p, s in targets):
        time.sleep(0.1)
    for pid, s in targets:
        if alive(pid, s):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(alive(p, s) for p, s in targets):
        time.sleep(0.05)
    return [p for p, s in targets if alive(p, s)]


def kill_marked(name: str, value: str, grace: float = 5.0) -> list[int]:
    """Terminate every process carrying the marker, repeating until none is left (or 3 rounds)."""
    survivors: list[int] = []
    for _ in range(3):
        pids = marked_pids(name, value)
        if not pids:
            return []
        survivors = terminate([(p, start_time(p)) for p in pids], grace)
        grace = 1.0
    return survivors


class ExitWaker:
    """``with ExitWaker(pid, started) as waker: ... waker.sleep(seconds)``: sleeps that end early,
    once, when process ``pid`` (started at ``started``) exits, through a pidfd (Linux 5.3+); plain
    sleeps where there is none, or when the process is not the one recorded. ``ddpjob submit -f`` and
    ``logs -f`` see a local job's end the moment its supervisor has written it, not at the next poll."""

    def __init__(self, pid: int, started: int | None) -> None:
        self.fd: int | None = None
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfds here, or no such process
            return
        if alive(pid, started):  # the pid is still the process recorded (checked after the open)
            self.fd = fd
        else:
            os.close(fd)

    def sleep(self, seconds: float) -> None:
        if self.fd is None:
            time.sleep(seconds)
            return
        import select

        if select.select([self.fd], [], [], seconds)[0]:  # it exited: later sleeps are whole again
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> ExitWaker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
