"""Nothing outlives its job on Slurm (issue 47 item 4): the node runner owns every process its run starts.

A worker may start a daemon in a session of its own and let its parent exit (a double fork): Linux then
hands the orphan to the nearest *child subreaper* above it, else to init. A cluster whose Slurm tracks a
step's processes by parentage (``ProctrackType=proctrack/linuxproc``) or by process group
(``proctrack/pgid``) loses such a daemon once it is init's, and it runs on after the job. So the runner
makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux): orphans of its run become its
children, inside the step's tree, where Slurm's own signals reach them too; and when the run ends it
stops every process still under it (SIGTERM, ``GRACE_S``, SIGKILL) and says in the node's log what it
stopped, pid and name, as the local supervisor does with its cgroup.

On cancel, a time limit or a requeue Slurm sends SIGTERM (after SIGCONT) to the step and SIGKILL
``KillWait`` seconds later, the runner included: a subreaper killed so hands its orphans to init. So on
SIGTERM the runner starts at once to stop what is under it apart from torchrun's own tree (torchrun has
the signal too and stops its workers), and goes on until the run ends, orphans of dying workers
included. ``proctrack/cgroup`` kills the whole cgroup anyway; this adds nothing that conflicts with it.

Standard library only, like all of ``job/``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
GRACE_S = 2.0  # SIGTERM to SIGKILL; well under KillWait (Slurm's default 30 s, the test cluster's 5 s)
GIVE_UP_S = 5.0  # after the SIGKILL: a process in uninterruptible sleep may take a while; then it is named
SWEEP_S = 0.1


def make_subreaper() -> str | None:
    """Make this process a child subreaper; None when it is one, else why not."""
    if not sys.platform.startswith("linux"):
        return f"not on Linux ({sys.platform})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl(PR_SET_CHILD_SUBREAPER): {exc}"
    return None


def _table() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, state letter)} of every process this one can see."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read().decode("utf-8", "replace")
            fields = data[data.rfind(")") + 2:].split()
            out[int(name)] = (int(fields[1]), fields[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def under(root: int, keep: Iterable[int] = (), table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Every process below ``root`` (not itself), leaving out ``keep`` and everything below those."""
    table = _table() if table is None else table
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    skip = set(keep)
    out, todo = [], [p for p in kids.get(root, []) if p not in skip]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [p for p in kids.get(pid, []) if p not in skip]
    return out


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f"{pid} {f.read().strip()}"
    except OSError:
        return str(pid)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def stop_under(root: int, keep: Iterable[int] = (), grace: float = GRACE_S) -> tuple[dict[int, str], list[int]]:
    """Stop every process below ``root`` but ``keep``'s trees: SIGTERM (and SIGCONT, for a stopped one),
    SIGKILL ``grace`` seconds after a process was first seen, and reap those that were ``root``'s children
    (this process's, as the subreaper: orphans come to it as their parents die). Returns ({pid: "pid
    name"} of the processes stopped, the pids still alive ``GIVE_UP_S`` seconds after their SIGKILL, or
    when ``3 * GIVE_UP_S`` more have passed)."""
    keep = set(keep)
    named: dict[int, str] = {}
    seen: dict[int, float] = {}
    started = time.monotonic()
    while True:
        table = _table()
        for pid in under(root, keep, table):
            if table[pid][0] == root and table[pid][1] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        table = _table()
        live = [p for p in under(root, keep, table) if table[p][1] not in "ZX"]
        if not live:
            return named, []
        now = time.monotonic()
        for pid in live:
            if pid not in seen:
                seen[pid] = now
                named[pid] = _name(pid)
                _signal(pid, signal.SIGTERM)
                _signal(pid, signal.SIGCONT)
            elif now - seen[pid] > grace:
                _signal(pid, signal.SIGKILL)
        if all(now - seen[p] > grace + GIVE_UP_S for p in live) or now - started > grace + 3 * GIVE_UP_S:
            return named, live  # unkillable (uninterruptible sleep), or new ones for ever (a fork loop)
        time.sleep(0.05)


def said(named: dict[int, str], survivors: list[int], when: str = "when it ended") -> str:
    """The node log's line on what was stopped ("" when nothing was), worded as the local supervisor's."""
    if not named:
        return ""
    names = list(named.values())
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    still = f"; {len(survivors)} would not stop (pids {', '.join(map(str, survivors[:5]))})" if survivors else ""
    return (f"{len(names)} process(es) the job left running {when} (pid {', '.join(names[:5])}{more}) were "
            f"stopped with it{still}")


class Reaper:
    """The runner's hold on what its run leaves: ``start()`` as the runner starts (subreaper, SIGTERM
    handler), ``end(log)`` whatever way the run ends. ``keep()`` gives the pids whose trees are left alone
    until then (torchrun: it stops its own workers)."""

    def __init__(self, keep: Callable[[], Iterable[int]]) -> None:
        self.keep = keep
        self.why_not: str | None = None
        self.log: str | None = None  # the node's log, once the runner knows it
        self._ended = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._lock = threading.RLock()  # end() may run again in the SIGTERM handler, over itself

    def start(self) -> Reaper:
        self.why_not = make_subreaper()
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: FrameType | None) -> None:
            if callable(previous):  # submitit's (it lets the run go on): sweep beside it
                self._sweep_now()
                previous(signum, frame)
            elif previous == signal.SIG_DFL:  # none before ours (not under submitit): stop all, then die of it
                self.end()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                self._sweep_now()

        try:
            signal.signal(signal.SIGTERM, on_term)
        except ValueError:  # not the main thread: the end of the run still stops what is left
            pass
        return self

    def _sweep_now(self) -> None:
        """On SIGTERM: stop what the run left outside torchrun's tree now, and keep at it until the end."""
        if self._sweeper is None and not self._ended.is_set():
            self._sweeper = threading.Thread(target=self._sweep, name="ddpjob-reaper", daemon=True)
            self._sweeper.start()

    def _sweep(self) -> None:
        while not self._ended.is_set():
            with self._lock:
                if self._ended.is_set():
                    return
                named, survivors = stop_under(os.getpid(), self.keep())
                self._say(said(named, survivors, "as Slurm stopped it"))
            self._ended.wait(SWEEP_S)

    def end(self, log: str | None = None) -> str:
        """The run ended: stop every process still under this one and say what was stopped in ``log``."""
        self.log = log or self.log
        self._ended.set()
        with self._lock:  # a sweep under way finishes first
            named, survivors = stop_under(os.getpid())
            line = said(named, survivors)
            self._say(line)
            if self.why_not:  # orphans went to init, out of reach: say why once
                self._say(f"a process a worker left in a session of its own may outlive the job: {self.why_not}")
                self.why_not = None
        return line

    def _say(self, line: str) -> None:
        if not line or not self.log:
            return
        try:
            with open(self.log, "ab", buffering=0) as f:
                f.write(f"[ddpjob] {line}\n".encode())
        except OSError:
            pass
