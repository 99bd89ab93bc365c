"""A run's starts after it loses a node (the spec's ``recovery:``), inside the job: what every node's
runner knows of them, on Slurm (``slurm/job/recover.py``) and in Kubernetes pods (``k8s/job/podrun.py``).
Standard library only: the pod runner's bundle carries this module (``ddpjob_restarts``).

The first node's runner hears every other node's heartbeats (``heartbeat.Watch``). Two things make it
start the run again:

- a node heard from before and then not for ``recovery.lost_after`` seconds is *lost* (``lost``): the
  run goes on with the nodes left, within the budget (``max_losses``) and while at least ``min_nodes``
  remain;
- a node heard from a new runner (a pod the operator recreated, a container restarted: the
  heartbeat's ``id`` changed) was *replaced* (``replaced``): the run starts again on as many nodes.

The first node then stops its torchrun, issues the next start (``order``: ``{"restart": n,
"members": [node ids]}``, which its watch answers to every heartbeat) and starts its torchrun again;
each other node's runner (``ordered``) stops its torchrun and starts it again with its rank among the
members. A node that is not among them, or that hears nothing from the first node for ``lost_after``
(``cut``), leaves the run. The program resumes from its checkpoint.

Every answer carries the watch's own id (``w``). A runner that starts (``join``) waits for the first
one: without an order, or with one that names it, it starts; a replaced node's new runner is told to
wait until the order that takes it in. A runner that hears a new watch id (the first node's runner
itself started again: its pod was recreated) starts again with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypedDict

try:
    from launcher.targets.shared.heartbeat import INTERVAL_S, clock
    from launcher.targets.shared.straggle import number
    from launcher.targets.shared.vitals import children
except ImportError:  # in a Kubernetes pod: the pod runner's bundle (``k8s/objects/runner.py``)
    from ddpjob_heartbeat import INTERVAL_S, clock  # type: ignore[import-not-found, no-redef]
    from ddpjob_straggle import number  # type: ignore[import-not-found, no-redef]
    from ddpjob_vitals import children  # type: ignore[import-not-found, no-redef]

RESTART_ENV = "DDPJOB_RESTART_COUNT"  # 1, 2, ... on each start after a loss; absent on the first


class Start(TypedDict):
    """A start of the run: its number after the first (``DDPJOB_RESTART_COUNT``) and its members."""

    restart: int
    members: list[int]


class Electing(TypedDict):
    """The first node is lost: why (the beacon's words), the member to take its place, and since when."""

    why: str
    candidate: int
    at: float


class Recovery:
    """One node's view of the run's starts. The watch's and beacon's threads call ``lost``, ``replaced``,
    ``ordered`` and ``cut``; the runner's main thread asks ``interrupted`` while torchrun runs and
    ``next_start`` when it ended. ``gone`` says what a silent node may have lost (the target's words)."""

    def __init__(self, *, node: int, nodes: int, hosts: list[str], max_losses: int, min_nodes: int,
                 lost_after: float, path: str | None, metrics: str | None,
                 gone: str = "its machine, slurmd, runner or link", joining: bool = False,
                 successor: bool = False) -> None:
        self.node, self.hosts, self.path, self.metrics, self.gone = node, list(hosts), path, metrics, gone
        # Slurm: when the first node is lost, the lowest other member takes its place, if the members it
        # hears are more than half the run's (a first node that hears fewer leaves: see ``lost``).
        self.successor = successor
        self.first = 0  # the node whose watch leads the run
        self.electing: Electing | None = None  # the first node is lost
        self.heard: Callable[[], set[int]] = lambda: set(self.members)  # the lead: members heard lately
        self.max_losses, self.min_nodes, self.lost_after = max_losses, min_nodes, lost_after
        self.nodes = nodes
        self.restart = 0  # this node's starts after the first (DDPJOB_RESTART_COUNT)
        self.members = list(range(nodes))
        self.losses: list[dict[str, object]] = []  # as ``recovery.json`` holds them (``shared/recovery.py``)
        self.started = time.time()
        self.pending: Start | None = None  # the next start
        self.leave: str | None = None  # why this node leaves the run
        self.failed: str | None = None  # why the run cannot go on (the first node)
        self.silent: Callable[[], float] = lambda: 0.0  # the first node: seconds since the stalest member was heard
        self.told: tuple[float, float] | None = None  # another node: (when, monotonic; silent) of the watch's last answer
        self.watch: str | None = None  # the first node's watch this node follows (its ``w``)
        self.followed: str | None = None  # the one it followed before (the first node was replaced), said in its beats
        self.numbered = 0  # the number of the newest start that watch ordered
        # A runner that starts may wait for the watch's word (``join``; the pod runner: a pod may be a
        # replaced node's); one that does not counts as joined to the run's first start.
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._joined = threading.Event()
        if node == 0 or not joining:
            self._joined.set()

    @property
    def rank(self) -> int:
        return self.members.index(self.node)

    @property
    def leads(self) -> bool:
        """Whether this node's watch leads the run (node 0, or the node that took its place)."""
        return self.node == self.first

    def host(self, node: int) -> str:
        return self.hosts[node] if 0 <= node < len(self.hosts) and self.hosts[node] else f"node {node}"

    # ------------------------------------------------------------ the first node (its watch's thread)

    def lost(self, rec: Mapping[str, object]) -> None:
        """``heartbeat.Watch.on_lost``: decide what the run does without node ``rec``."""
        node = rec.get("node")
        with self._lock:
            # A second loss before the start after the first: from the members that start will have.
            members = self.pending["members"] if self.pending else self.members
            if not isinstance(node, int) or node not in members or self.failed or self.leave:
                return
            heard_at = rec.get("heard")  # the watch's: a time, or None before it heard the node
            now, heard = time.time(), float(heard_at) if isinstance(heard_at, (int, float)) and heard_at else time.time()
            self._named(node, rec)
            how = (f"no heartbeat from its node runner since {clock(heard)} ({int(now - heard)} s; recovery.lost_after "
                   f"{self.lost_after:g} s): {self.gone} is gone")
            left = [m for m in members if m != node]
            alive = sorted({self.node} | (self.heard() & set(left)))
            if self.successor and 2 * len(alive) < len(members):
                # Most of the run is silent at once: this node is more likely cut off than they all lost.
                # It leaves; the others, if they hear each other, go on without it (``elect``).
                self.leave = (f"node {self.node} ({self.host(self.node)}) heard {len(alive)} of the run's "
                              f"{len(members)} nodes in the last {self.lost_after / 2:g} s (node {node}: {how}): cut "
                              "off from most of the run, it stopped its ranks and left it to the others")
                self._changed.set()
                return
            self._decide(node, how, left, replaced=False)

    def replaced(self, rec: Mapping[str, object]) -> None:
        """``heartbeat.Watch.on_replaced``: node ``rec`` speaks from a new runner; the run starts again
        with it, on as many nodes."""
        node = rec.get("node")
        with self._lock:
            members = self.pending["members"] if self.pending else self.members
            if not isinstance(node, int) or node not in members or self.failed:
                return
            self._named(node, rec)
            how = (f"its node runner started again at {clock(time.time())}: a new one in its place (the old one's pod "
                   "or container deleted, evicted, or its machine lost); the run starts again with it")
            self._decide(node, how, list(members), replaced=True)

    def first_replaced(self, rec: Mapping[str, object]) -> None:
        """``heartbeat.Watch.on_followed``: node ``rec`` followed another first node's watch before this
        one's: this runner is the first node's new one (its pod recreated) and the run started again with
        it. Told as a loss of node 0 (when it was lost is not known here: before this runner started)."""
        with self._lock:
            how = (f"the first node's runner started again at {clock(self.started)}: a new one in its place (the old "
                   f"one's pod or container deleted, evicted, or its machine lost); node {rec.get('node')} had "
                   "followed the old one, and the run started again with the new one")
            self.losses.append({"node": 0, "host": self.host(0), "at": self.started, "how": how,
                                "nodes": len(self.members), "replaced": True, "back_at": self.started})
            self.write()

    def beat(self) -> dict[str, object]:
        """What a beacon adds to its heartbeats (``heartbeat.Beacon.extra``)."""
        return {"followed": self.followed} if self.followed else {}

    def _named(self, node: int, rec: Mapping[str, object]) -> None:
        host = rec.get("host")
        if isinstance(host, str) and host and 0 <= node < len(self.hosts) and not self.hosts[node]:
            self.hosts[node] = host

    def _decide(self, node: int, how: str, left: list[int], *, replaced: bool) -> None:
        host = self.host(node)
        self.losses.append({"node": node, "host": host, "at": time.time(), "how": how, "nodes": len(left),
                            "replaced": replaced})
        what = f"node {node} ({host}) was lost: {how}"
        if len(self.losses) > self.max_losses:
            self.failed = (f"{what}; not brought back: the run had lost {len(self.losses) - 1} node(s) before, "
                           f"and recovery.max_losses is {self.max_losses}")
        elif len(left) < self.min_nodes:
            self.failed = (f"{what}; not brought back: {len(left)} node(s) left, fewer than recovery.min_nodes "
                           f"({self.min_nodes})")
        else:
            self.pending = {"restart": self.restart + 1, "members": left}
        self.write()
        self._changed.set()

    def order(self) -> Start:
        """What the first node's watch answers every heartbeat with: the start that runs now."""
        return {"restart": self.restart, "members": list(self.members)}

    def back(self, note: str = "") -> None:
        """The first node started its torchrun again: the last loss is over."""
        with self._lock:
            if self.losses and self.losses[-1].get("back_at") is None:
                self.losses[-1].update(back_at=time.time(), **({"note": note} if note else {}))
            self.write()

    def record(self, **extra: object) -> dict[str, object]:
        """``recovery.json`` as this node writes it (the first pod's ``watch.json`` carries it too)."""
        return {"restart": self.restart, "members": self.members, "hosts": self.hosts, "losses": self.losses,
                "metrics": self.metrics, "started": self.started, "first": self.first, **extra}

    def write(self, **extra: object) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.record(**extra), f)
            os.replace(tmp, self.path)
        except OSError:
            pass

    # ------------------------------------------------------------ the other nodes (their beacon's thread)

    def ordered(self, order: Mapping[str, object]) -> None:
        """``heartbeat.Beacon.on_order``: the first node's answer (see the module)."""
        w, restart, listed, silent = order.get("w"), order.get("restart"), order.get("members"), order.get("silent")
        if (seconds := number(silent)) is not None:
            self.told = (time.monotonic(), seconds)
        if listed is not None and (not isinstance(listed, list) or not all(isinstance(m, int) for m in listed)):
            return
        watch = w if isinstance(w, str) else None  # the watch's id
        members = None if listed is None else [m for m in listed if isinstance(m, int)]
        with self._lock:
            if self.leave:
                return
            if self.electing is not None:  # the first node is lost: only the candidate's order counts
                if watch is None or watch == self.watch or order.get("wait") or not isinstance(restart, int) \
                        or members is None:
                    return
                self.first, self.watch, self.numbered = self.electing["candidate"], watch, restart
                self.electing = None
                self._start(restart, members)
                return
            if watch is not None and self.watch is not None and watch != self.watch:
                # The first node's runner started again (a new pod): start again with it, on every node.
                self.followed, self.watch, self.numbered = self.watch, watch, restart if isinstance(restart, int) else 0
                self._start(self.restart + 1, members if members is not None else list(range(self.nodes)))
                return
            self.watch = self.watch or (watch if isinstance(watch, str) else None)
            if order.get("wait"):  # a replaced node's new runner: the start that takes it in comes next
                return
            if not isinstance(restart, int) or members is None:
                if not self.joined:  # no start ordered yet: the run's first
                    self._join()
                return
            if not self.joined:
                self.numbered = restart
                if self.node in members:
                    self.restart, self.members = restart, members
                    self._join()
                else:
                    self.leave = f"node {self.node} ({self.host(self.node)}) is not in the run (start {restart + 1})"
                    self._join()
                    self._changed.set()
                return
            if restart <= self.numbered:
                return
            self.numbered = restart
            self._start(max(restart, self.restart + 1), members)

    def _start(self, restart: int, members: list[int]) -> None:
        if self.node in members:
            self.pending = {"restart": restart, "members": members}
        else:
            self.leave = f"node {self.node} ({self.host(self.node)}) is no longer in the run (start {restart + 1})"
        self._join()
        self._changed.set()

    @property
    def joined(self) -> bool:
        """Whether this runner joined a start of the run (the first, or the one that took it in)."""
        return self._joined.is_set()

    def _join(self) -> None:
        self._joined.set()

    def join(self, timeout: float) -> bool:
        """A runner that starts: wait (up to ``timeout``) for the first node's word before starting
        torchrun; False when none came (no heartbeats: it starts with the run's first start)."""
        return self._joined.wait(timeout)

    def cut(self, message: str) -> None:
        """``heartbeat.Beacon.on_cut``: nothing heard from the first node for ``lost_after``. With a
        successor, the lowest other member is to take its place (``electing``); a node that then hears
        nothing from that one either leaves."""
        with self._lock:
            if self.successor and not self.leave and self.electing is None:
                self.electing = {"why": message, "candidate": min(m for m in self.members if m != self.first),
                                 "at": time.time()}
            elif self.electing is not None:
                self.leave = self.leave or (f"{message} (node {self.electing['candidate']}, which was to take the "
                                            "lost first node's place); it stopped its ranks and left the run")
            else:
                self.leave = self.leave or f"{message}; it stopped its ranks and left the run"
        self._join()
        self._changed.set()

    def elect(self, heard: set[int]) -> None:
        """The candidate, once it listened for the others (``heard``): it takes the first node's place if
        the members it hears, itself included, are more than half the run's; else it leaves."""
        with self._lock:
            if self.electing is None:
                return
            why, old = self.electing["why"], self.first
            self.electing = None
            group = sorted(({self.node} | (heard & set(self.members))) - {old})
            if 2 * len(group) <= len(self.members):
                self.leave = (f"{why}; node {self.node} was to take its place but heard {len(group)} of the run's "
                              f"{len(self.members)} nodes: a half or less does not go on; it stopped its ranks and "
                              "left the run")
                self._changed.set()
                return
            self.first = self.node
            self._adopt()
            how = (f"{why}: {self.gone} is gone; node {self.node} ({self.host(self.node)}) took its place as the first "
                   f"node, hearing {len(group)} of the run's {len(self.members)} nodes")
            self._decide(old, how, group, replaced=False)

    def _adopt(self) -> None:
        """The record the lost first node wrote (the run's earlier losses, when it started)."""
        try:
            with open(self.path or "", encoding="utf-8") as f:
                prior = json.load(f)
        except (OSError, ValueError):
            return
        if isinstance(prior, dict) and isinstance(prior.get("losses"), list):
            self.losses = [x for x in prior["losses"] if isinstance(x, dict)] + self.losses
            if isinstance(prior.get("started"), (int, float)):
                self.started = float(prior["started"])

    def decided(self, timeout: float) -> None:
        """A node that follows the candidate: wait (up to ``timeout``) for its order, or to leave."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.pending is not None or self.leave or self.failed:
                    return
            time.sleep(0.2)

    # ------------------------------------------------------------ the runner's main thread

    def interrupted(self) -> bool:
        """Whether the torchrun that runs now must stop: a new start, this node leaving, or the end."""
        return self._changed.is_set()

    def next_start(self, code: int) -> Start | None:
        """After torchrun ended with ``code``: the next start, or None when the run ends here (see
        ``leave`` and ``failed``). A torchrun that failed may have failed because a node was lost
        before the watch could tell (its workers' peers went away): wait for the verdict then, or until
        the first node, a while after, has heard every member lately (the program failed by itself)."""
        if code != 0 and not self._changed.is_set():
            self._await_verdict()
        with self._lock:
            self._changed.clear()
            if self.failed or self.leave or self.pending is None:
                return None
            start, self.pending = self.pending, None
            self.restart, self.members = start["restart"], start["members"]
            if self.leads:
                self.numbered = self.restart
            return start

    def _await_verdict(self) -> None:
        # A member silent for a while is being lost; every member heard lately (by the first node's watch,
        # or as its last answer to this node says) after the failure: the program failed by itself.
        t0, fresh_for = time.monotonic(), 3 * INTERVAL_S + 1
        while not self._changed.wait(0.5):
            waited, told = time.monotonic() - t0, self.told
            fresh = self.silent() < fresh_for if self.leads else (
                told is not None and told[0] - t0 > fresh_for and told[1] < fresh_for)
            if waited > self.lost_after + 3 * INTERVAL_S or (waited > fresh_for and fresh):
                return


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun and every process under it (its workers run in sessions of their own), now:
    they wait in a collective for a peer that is gone, so nothing they would do on SIGTERM can end."""
    pids, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children(pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
