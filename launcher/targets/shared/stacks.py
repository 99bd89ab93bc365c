"""Every rank's Python stack, read from outside the rank by py-spy (``ddpjob stacks``, issue 44).

py-spy (``pip install 'ddpjob[stacks]'``) reads a running Python process's memory through ptrace and
prints each thread's stack; it needs nothing from the program and pauses it for about a millisecond.
This module finds the binary (``DDPJOB_PY_SPY`` when set, else the one beside this interpreter, else
the PATH's), runs ``py-spy dump --json`` on each rank's pid at once (in threads: a job of 16 nodes
answers in the time of one dump), and turns what it says, or why it could not, into ``RankStack``s.
Standard library only: the node runners may carry it into a job later.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

PY_SPY_ENV = "DDPJOB_PY_SPY"
HOW_TO_GET = ("ddpjob stacks reads each rank with py-spy, which is not installed here: pip install 'ddpjob[stacks]' "
              f"(or pip install py-spy), or set {PY_SPY_ENV} to a py-spy binary")
DUMP_TIMEOUT_S = 10.0
# What py-spy says when it cannot read a process, and what that means for a user (first match wins).
_WHY = (
    (("Permission denied", "Operation not permitted", "EPERM", "ptrace"),
     "not permitted to read another process (ptrace): run as the rank's user with kernel.yama.ptrace_scope 0, "
     "or as root; in a container the engine must allow it (CAP_SYS_PTRACE, e.g. podman --cap-add SYS_PTRACE)"),
    (("No such process", "ESRCH", "process has exited", "No such file or directory"), "the process has ended"),
    (("Failed to find python version", "Failed to get process executable name", "python interpreter"),
     "not a Python process that py-spy can read (or still starting)"),
)


@dataclass
class Frame:
    function: str
    file: str  # as py-spy shortens it (the package part), for one line
    line: int
    path: str  # the whole file name, for -v

    def short(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass
class Thread:
    name: str
    os_id: int | None
    active: bool  # running (or waiting on the GIL) when read, not idle in a wait
    frames: list[Frame]  # the innermost first


@dataclass
class RankStack:
    node: int
    rank: int | None
    local_rank: int | None
    pid: int
    host: str | None = None
    threads: list[Thread] = field(default_factory=list)
    error: str | None = None  # why it could not be read

    def main(self) -> Thread | None:
        """The thread the program runs in: MainThread, else the first py-spy lists."""
        return next((t for t in self.threads if t.name == "MainThread"), self.threads[0] if self.threads else None)

    def innermost(self) -> Frame | None:
        main = self.main()
        return main.frames[0] if main and main.frames else None


@dataclass
class JobStacks:
    task: int
    ranks: list[RankStack]
    note: str | None = None  # what could not be asked (a node of another machine, a run that ended)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def find_py_spy() -> str | None:
    """The py-spy binary to run: ``DDPJOB_PY_SPY`` when set (empty: none), else beside this interpreter
    (a virtual environment's bin), else on the PATH."""
    given = os.environ.get(PY_SPY_ENV)
    if given is not None:
        return given if given and os.path.isfile(given) and os.access(given, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def why_not(text: str) -> str:
    """py-spy's error output as one line a user can act on."""
    for needles, meaning in _WHY:
        if any(n.lower() in text.lower() for n in needles):
            return meaning
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(" ")), "")
    return f"py-spy could not read it: {first[:200] or 'no reason given'}"


def parse(data: object) -> list[Thread]:
    """``py-spy dump --json``'s threads (a list of {thread_name, os_thread_id, active, frames: [{name,
    filename, short_filename, line}]}, innermost frame first)."""
    threads = []
    for t in data if isinstance(data, list) else []:
        if not isinstance(t, dict):
            continue
        frames = [Frame(str(f.get("name") or "?"), str(f.get("short_filename") or f.get("filename") or "?"),
                        int(f.get("line") or 0), str(f.get("filename") or "?"))
                  for f in t.get("frames") or [] if isinstance(f, dict)]
        os_id = t.get("os_thread_id")
        threads.append(Thread(str(t.get("thread_name") or t.get("thread_id") or "?"),
                              os_id if isinstance(os_id, int) else None, bool(t.get("active")), frames))
    return threads


def dump(py_spy: str, rank: RankStack, timeout: float = DUMP_TIMEOUT_S) -> RankStack:
    """``rank`` with its threads read by ``py-spy dump``, or the reason it could not be."""
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(rank.pid), "--json"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        rank.error = f"py-spy did not answer within {timeout:g} s"
        return rank
    except OSError as exc:
        rank.error = f"py-spy could not be run: {exc}"
        return rank
    text = done.stdout.decode("utf-8", "replace")
    if done.returncode == 0:
        try:
            rank.threads = parse(json.loads(text))
            return rank
        except ValueError:
            pass
    rank.error = why_not(done.stderr.decode("utf-8", "replace") + "\n" + text)
    return rank


def dump_all(py_spy: str, ranks: list[RankStack], timeout: float = DUMP_TIMEOUT_S) -> list[RankStack]:
    """Every rank read at once (one thread each, at most 64 at a time), in the order given."""
    if not ranks:
        return []
    with ThreadPoolExecutor(max_workers=min(64, len(ranks))) as pool:
        return list(pool.map(lambda r: dump(py_spy, r, timeout), ranks))
