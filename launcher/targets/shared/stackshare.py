"""``ddpjob stacks`` where the job's folder is shared by every node (Slurm): the client writes a request
(``ask``) in the task's folder, every node's runner answers with its own ranks read by py-spy
(``Answerer``, started by ``answering``), and the first node's watch asks the same way when it names a
stall (``asking``: ``heartbeat.Watch``'s ``where``). Standard library only: the node runners import it, and
the Kubernetes pod runner's bundle carries it (``rank_stack``: the other pods' answers, ``k8s/job/podstacks.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from collections.abc import Mapping, Sequence

    from launcher.targets.shared.runfolder import TaskFolder

try:
    from launcher.targets.shared.stacks import (
        Frame,
        JobStacks,
        RankStack,
        Thread,
        dump_all,
        find_py_spy,
        integer,
        save,
        summary,
    )
except ImportError:  # in a Kubernetes pod: the pod runner's bundle (``k8s/objects/runner.py``), no ddpjob installed
    from ddpjob_stacks import (  # type: ignore[import-not-found, no-redef]
        Frame,
        JobStacks,
        RankStack,
        Thread,
        dump_all,
        find_py_spy,
        integer,
        save,
        summary,
    )

ANSWER_EVERY_S, ASK_TIMEOUT_S = 1.0, 10.0  # how often a node's runner looks for a request; how long one waits


class Answerer:
    """A node runner's side of ``ddpjob stacks`` on a target whose job folder every node shares (Slurm):
    every ``ANSWER_EVERY_S`` it reads ``request`` (``{"id": ...}``, written by ``ddpjob stacks``); a new id
    is answered in ``answer`` with this node's ranks (``ranks()``: from its last vitals sample) read now."""

    def __init__(self, request: str, answer: str, node: int, host: str,
                 ranks: Callable[[], list[dict[str, object]]]) -> None:
        self.request, self.answer, self.node, self.host, self.ranks = request, answer, node, host, ranks
        self._last: str | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="ddpjob-stacks", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(ANSWER_EVERY_S):
            try:
                with open(self.request, encoding="utf-8") as f:
                    asked = json.load(f)
            except (OSError, ValueError):
                continue
            ident = str(asked.get("id")) if isinstance(asked, dict) else None
            if not ident or ident == self._last:
                continue
            self._last = ident
            self.answer_now(ident)

    def answer_now(self, ident: str) -> None:
        py_spy = find_py_spy()
        ranks = [RankStack(node=self.node, rank=integer(r.get("rank")), local_rank=integer(r.get("local_rank")), pid=pid,
                           host=self.host) for r in self.ranks() if isinstance(pid := r.get("pid"), int)]
        if py_spy is None:
            for r in ranks:
                r.error = f"py-spy is not installed on {self.host} (pip install 'ddpjob[stacks]' where the job runs)"
        found = dump_all(py_spy, ranks) if py_spy else ranks
        try:
            with open(self.answer + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"id": ident, "node": self.node, "host": self.host, "ranks": [asdict(r) for r in found]}, f)
            os.replace(self.answer + ".tmp", self.answer)
        except OSError:
            pass


def answering(old: Answerer | None, request: str, answer: str, node: int, host: str,
              ranks: Callable[[], list[dict[str, object]]]) -> Answerer:
    """A node runner's ``Answerer`` for its torchrun now, started (the one before it, if any, stopped)."""
    if old is not None:
        old.stop()
    new = Answerer(request, answer, node, host, ranks)
    new.start()
    return new


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _whole(value: object) -> int:
    """``int(value or 0)`` for what it takes (a number, or text of one); TypeError for anything else."""
    if isinstance(value, (int, float, str)):
        return int(value or 0)
    if value is None:
        return 0
    raise TypeError(f"not a number: {type(value).__name__}")


def _each(value: object) -> list[Mapping[str, object]]:
    """The objects of a JSON list (anything else in it, or a value that is no list: none)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def rank_stack(data: Mapping[str, object]) -> RankStack:
    """A ``RankStack`` back from its JSON (``asdict``)."""
    threads = [Thread(str(t.get("name")), integer(t.get("os_id")), bool(t.get("active")),
                      [Frame(str(f.get("function")), str(f.get("file")), _whole(f.get("line")), str(f.get("path")))
                       for f in _each(t.get("frames"))]) for t in _each(data.get("threads"))]
    return RankStack(node=_whole(data.get("node")), rank=integer(data.get("rank")), local_rank=integer(data.get("local_rank")),
                     pid=_whole(data.get("pid")), host=_text(data.get("host")), threads=threads,
                     error=_text(data.get("error")))



def ask(request: str, answers: list[str], hosts_seen: int, timeout: float = ASK_TIMEOUT_S) -> tuple[list[RankStack], str | None]:
    """``ddpjob stacks`` where the job's folder is shared: write a new ``request`` and wait (up to
    ``timeout``) for each node's runner to answer in its file of ``answers``; the ranks read, and a note
    naming the nodes that did not answer (``hosts_seen``: how many nodes to expect at least)."""
    ident = os.urandom(6).hex()
    with open(request + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"id": ident, "at": time.time()}, f)
    os.replace(request + ".tmp", request)
    deadline = time.monotonic() + timeout
    got: dict[int, dict[str, object]] = {}
    while True:
        for node, path in enumerate(answers):
            if node in got:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("id") == ident:
                got[node] = data
        if len(got) >= max(1, hosts_seen) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ranks = [rank_stack(r) for data in got.values() for r in _each(data.get("ranks"))]
    silent = [n for n in range(max(hosts_seen, 1)) if n not in got]
    note = (f"node(s) {', '.join(map(str, silent))} did not answer within {timeout:g} s (their runner is gone, "
            "busy, or the job's folder is not shared with them)") if silent else None
    return ranks, note


def asking(task: TaskFolder, nodes: int) -> Callable[[Mapping[str, object], Sequence[Mapping[str, object]]], str | None]:
    """``heartbeat.Watch``'s ``where`` where the job's folder is shared (Slurm): ``task`` (a ``runfolder.TaskFolder``)
    holds the request every node's runner answers (``Answerer``) with its own ranks; the stacks are kept in
    its ``stacks``, the one line ``summary`` returned."""
    def where_shared(verdict: Mapping[str, object], seen: Sequence[Mapping[str, object]]) -> str | None:
        ranks, note = ask(task.stacks_request, [task.node_stacks(n) for n in range(nodes)], nodes)
        found = JobStacks(task=0, ranks=ranks, note=note)
        save(task.stacks, verdict, found)
        line = summary(ranks, integer(verdict.get("rank")) if verdict.get("kind") == "stuck" else None)
        return "; ".join(x for x in (line, note) if x) or None
    return where_shared
