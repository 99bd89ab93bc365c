"""Every rank's Python stack, read from outside the rank by py-spy (``ddpjob stacks``, issue 44).

py-spy (``pip install 'ddpjob[stacks]'``) reads a running Python process's memory through ptrace and
prints each thread's stack; it needs nothing from the program and pauses it for about a millisecond.
This module finds the binary (``DDPJOB_PY_SPY`` when set, else the one beside this interpreter, else
the PATH's), runs ``py-spy dump --json`` on each rank's pid at once (in threads: a job of 16 nodes
answers in the time of one dump), and turns what it says, or why it could not, into ``RankStack``s.
When the stall watch names a stall, ``where`` takes every rank's stack once (the local node wrapper's
watch, where every rank is on this machine), keeps it beside ``watch.json`` and says in one line where
the stuck rank stopped and what the others wait in, which ``status`` shows with the verdict; where the
job's folder is shared (Slurm) each node's runner reads its own ranks instead (``stackshare.py``).
``FrameSampler`` samples where each rank is, for the straggler rule. Standard library only: the node
wrappers import it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.core.jsondata import JSONObject

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


def dump(py_spy: str, rank: RankStack, timeout: float = DUMP_TIMEOUT_S, *, pause: bool = True) -> RankStack:
    """``rank`` with its threads read by ``py-spy dump``, or the reason it could not be. py-spy pauses the
    process while it reads (``pause``), which fails on a stopped one (SIGSTOP, a debugger): then it reads
    again without pausing (``--nonblocking``: the stack of a stopped process does not move)."""
    said = ""
    for extra in ([], ["--nonblocking"]) if pause else (["--nonblocking"],):
        try:
            done = subprocess.run([py_spy, "dump", "--pid", str(rank.pid), "--json", *extra], stdin=subprocess.DEVNULL,
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
        said = done.stderr.decode("utf-8", "replace") + "\n" + text
        if "Failed to get stack traces" not in said:
            break
    rank.error = why_not(said)
    return rank


def dump_all(py_spy: str, ranks: list[RankStack], timeout: float = DUMP_TIMEOUT_S, *,
             pause: bool = True) -> list[RankStack]:
    """Every rank read at once (one thread each, at most 64 at a time), in the order given."""
    if not ranks:
        return []
    with ThreadPoolExecutor(max_workers=min(64, len(ranks))) as pool:
        return list(pool.map(lambda r: dump(py_spy, r, timeout, pause=pause), ranks))


def summary(ranks: list[RankStack], stuck: int | None = None) -> str:
    """One line: where rank ``stuck`` stopped, then what the others' main threads are in, grouped by their
    innermost frame (``rank 1 stopped in data.py:88 read_shard; rank 0 waits in all_reduce
    (distributed_c10d.py:3913)``); ranks that could not be read, and why, last."""
    parts: list[str] = []
    groups: dict[str, list[int | None]] = {}
    unread: dict[str, list[int | None]] = {}
    for r in sorted(ranks, key=lambda r: r.rank if r.rank is not None else -1):
        top = r.innermost()
        main = r.main()
        if r.error or top is None or main is None:
            unread.setdefault(r.error or "no Python frame", []).append(r.rank)
            continue
        own = _own_frame(main)  # where the program itself is (the innermost frame where none is its own)
        called = f" from {own.file}:{own.line}" if own is not None and own is not top else ""
        if r.rank == stuck:
            parts.append(f"rank {r.rank} stopped in {top.file}:{top.line} {top.function}{called}")
        else:
            groups.setdefault(f"{top.function} ({top.file}:{top.line}){called}", []).append(r.rank)
    for where, who in groups.items():
        parts.append(f"{_ranks(who)} {'waits' if len(who) == 1 else 'wait'} in {where}")
    parts += [f"{_ranks(who)} not read: {why}" for why, who in unread.items()]
    return "; ".join(parts)


def _own_frame(thread: Thread) -> Frame | None:
    """The innermost frame of the program itself (not of a package or of Python's library), else the innermost."""
    return next((f for f in thread.frames if not _library(f.path)), thread.frames[0] if thread.frames else None)


def _library(path: str) -> bool:
    """A frame of an installed package or of Python's own library, not of the program."""
    return any(part in path for part in ("/site-packages/", "/dist-packages/")) or "/lib/python3" in path


def _ranks(who: list[int | None]) -> str:
    return ("rank " if len(who) == 1 else "ranks ") + ",".join("?" if r is None else str(r) for r in who)


def where(verdict: Mapping[str, object], nodes: Sequence[Mapping[str, object]], keep: str | None = None) -> str | None:
    """``heartbeat.Watch``'s ``where``: every rank the nodes' last samples name (their pids on this machine),
    read once; all of it kept in ``keep`` (``stacks.json``) and the one line ``summary`` returned (how to
    get py-spy, when it is not here)."""
    py_spy = find_py_spy()
    if py_spy is None:
        return "where each rank is: not read (pip install 'ddpjob[stacks]' for py-spy)"
    ranks = []
    for rec in nodes:
        vitals, node, host = rec.get("vitals"), integer(rec.get("node")), rec.get("host")
        listed = vitals.get("ranks") if isinstance(vitals, dict) else None
        for r in listed if isinstance(listed, list) else []:
            if isinstance(r, dict) and isinstance(pid := r.get("pid"), int) and r.get("state") not in ("X", "Z"):
                ranks.append(RankStack(node=node or 0, rank=integer(r.get("rank")), local_rank=integer(r.get("local_rank")),
                                       pid=pid, host=host if isinstance(host, str) else None))
    if not ranks:
        return None
    found = JobStacks(task=0, ranks=dump_all(py_spy, ranks))
    save(keep, verdict, found)
    return summary(found.ranks, integer(verdict.get("rank")) if verdict.get("kind") == "stuck" else None) or None


def integer(value: object) -> int | None:
    """``value`` if it is an int (not a bool), else None: a rank, a pid or a node read from JSON."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- where each rank spends its time (stragglers)

SAMPLE_ENV = "DDPJOB_SAMPLE_STACKS"  # "0": the node runners sample no stacks
SAMPLE_EVERY_S = 2.0  # at most this often; less often where py-spy's own CPU would pass BUDGET
BUDGET = 0.01  # of the node's CPU: each py-spy starts afresh (~0.1 CPU s a rank to read its interpreter)
WINDOW = 6  # the samples a rank's place is told from
# No sample in a runner's first seconds: its ranks are importing (py-spy would read the import machinery, no
# place of the program's), and a read costs ~0.1 CPU s a rank just when a start is at its costliest.
FIRST_S = 5.0
# A rank whose main thread is in one of these waits on its peers: a collective, or DDP's backward, whose
# gradient all-reduce the autograd engine waits for.
_WAITING = ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/")


def waiting(thread: Thread) -> bool:
    return any(w in f"/{f.path}" for f in thread.frames for w in _WAITING)


class FrameSampler:
    """Each rank's innermost frames, read without pausing the rank (py-spy's ``--nonblocking``): per pid,
    the last ``WINDOW`` samples, whether it waited on its peers and where it was. A node's vitals
    (``vitals.Sampler``) carry its summary to the watch, whose straggler rule (``straggle.py``) names the
    rank the others keep waiting for, whatever it spends its time on. Read every ``SAMPLE_EVERY_S`` at
    most, and no more often than keeps the CPU the py-spy processes took (measured each time, as this
    process's children's) under ``BUDGET`` of the cores this node may use; the first not before
    ``first_s`` after it is made (``FIRST_S``: the runner makes it as it starts)."""

    def __init__(self, py_spy: str, every_s: float = SAMPLE_EVERY_S, first_s: float = FIRST_S) -> None:
        self.py_spy, self.every_s = py_spy, every_s
        self.windows: dict[int, deque[tuple[bool, str]]] = {}
        self._next = time.monotonic() + first_s

    def __call__(self, pids: list[int]) -> dict[int, JSONObject]:
        now = time.monotonic()
        if now >= self._next:
            for gone in set(self.windows) - set(pids):
                del self.windows[gone]
            before = _children_cpu()
            for r in dump_all(self.py_spy, [RankStack(node=0, rank=None, local_rank=None, pid=p) for p in pids],
                              timeout=max(2.0, 2 * self.every_s), pause=False):
                main = r.main()
                top = _own_frame(main) if main is not None and not r.error else None
                if main is not None and top is not None:
                    self.windows.setdefault(r.pid, deque(maxlen=WINDOW)).append((waiting(main), top.short()))
            spent = max(0.0, _children_cpu() - before)
            self._next = now + max(self.every_s, min(60.0, spent / (BUDGET * _cores())))
        out: dict[int, JSONObject] = {}
        for pid, window in self.windows.items():
            places = Counter(at for wait, at in window if not wait)
            out[pid] = {"n": len(window), "wait": sum(wait for wait, _ in window),
                        "at": places.most_common(1)[0][0] if places else None}
        return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def frame_sampler(env: dict[str, str] | None = None) -> FrameSampler | None:
    """The node runner's sampler: None where py-spy is not installed or ``DDPJOB_SAMPLE_STACKS=0`` (in
    ``env``, the job's, else this process's environment)."""
    if (os.environ if env is None else env).get(SAMPLE_ENV, "").strip() == "0":
        return None
    py_spy = find_py_spy()
    return FrameSampler(py_spy) if py_spy else None


def save(path: str | None, verdict: Mapping[str, object], found: JobStacks) -> None:
    """The stacks read when ``verdict`` was named, kept whole in ``path`` (``stacks.json``)."""
    if not path:
        return
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"verdict": dict(verdict), **found.to_json()}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass
