"""Heartbeats between the nodes of a run, to notice a node that goes silent. Standard library only:
it runs inside jobs (possibly in a container), beside each node's torchrun.

Ranks blocked in a collective print nothing, on every node alike, so output alone cannot say which node
was lost. The network can: every other node sends a small UDP datagram to the first node (the rendezvous
host, at the rendezvous port number) every ``INTERVAL_S`` seconds, saying how much output it has
written; the first node answers each one. Then:

- the first node's ``Watch`` knows, per node, when it last heard from it and when its output (its own
  with the run's metrics file as progress) last grew. A node not heard from for the stall timeout is
  *lost*; a run in which no node has written output or made progress for that long is *quiet* (often
  only the first node's ranks print). It writes what it knows to ``watch.json`` every interval, for
  ``ddpjob status``, and with ``action == "fail"`` calls ``on_stall`` once, which ends the run;
- each other node's ``Beacon`` knows when the first node last answered; with no answer for the stall
  timeout, it calls ``on_stall`` (``action == "fail"``): a node cut off ends its own processes.

With ``lost_after`` and ``on_lost`` (the spec's ``recovery:``), the watch drops a node it heard from
before and then not for ``lost_after`` seconds and calls ``on_lost`` once; a dropped node is judged no
more. Each beacon sends its runner's ``id``: a node heard with a new one was replaced (a recreated pod),
the watch calls ``on_replaced`` and answers it ``wait`` until its owner ``issue``s the next start. Every
answer carries the watch's id (``w``), the start issued last (``order``) and the seconds since it heard
its stalest node (``silent``), which a beacon hands to ``on_order`` (``shared/restarts.py``). A beacon
that followed another first node's watch says so, and the watch calls ``on_followed`` once (the first
node was replaced); one that hears nothing for ``lost_after`` calls ``on_cut`` once. A Slurm run whose
first node is lost goes on with the next as its first (``slurm/job/recover.py``'s ``elect``): that watch
(``own``, the lost node ``gone``) answers ``wait`` (``hold``) until its owner issues the next start, and
the beacons ``follow`` it. Nothing is sent anywhere but the first node's address (the rendezvous's).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from collections.abc import Iterable, Mapping
    Record = dict[str, object]  # a JSON object the watch builds or is handed (node, verdict, beat, vitals)

try:
    from launcher.targets.shared.straggle import Straggle, number, to_float
except ImportError:  # in a Kubernetes pod: the pod runner's bundle (``k8s/objects/runner.py``), no ddpjob installed
    from ddpjob_straggle import Straggle, number, to_float  # type: ignore[import-not-found, no-redef]

INTERVAL_S = 2.0


def _size(paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class Watch:
    """The first node's side: hears every other node, writes ``state_path``, judges stalls."""
    WHERE_AGAIN_S = 15.0  # while a verdict stands, where each rank is is read again (at most this often)

    def __init__(self, *, port: int, nodes: int, host: str, outputs: list[str], timeout: float, action: str,
                 state_path: str, on_stall: Callable[[str], None], interval: float = INTERVAL_S,
                 vitals: Callable[[], Record] | None = None, lost_after: float | None = None,
                 on_lost: Callable[[Record], None] | None = None,
                 on_replaced: Callable[[Record], None] | None = None,
                 on_followed: Callable[[Record], None] | None = None,
                 extra: Callable[[], Record] | None = None, own: int = 0,
                 gone: tuple[int, ...] = (), hold: bool = False,
                 where: Callable[[Record, list[Record]], str | None] | None = None) -> None:
        self.port, self.timeout, self.action, self.state_path = port, timeout, action, state_path
        self.own = own  # the node this watch runs on: 0, or the one that took the first node's place
        self.hold = hold  # answer every node "wait" until the first ``issue`` (a new first node's election)
        self.lost_after, self.on_lost, self.on_replaced, self.extra = lost_after, on_lost, on_replaced, extra
        self.on_followed = on_followed  # once: a node says it followed another first node's watch before this one
        self.order: Record | None = None  # answered to every heartbeat once set (see the module)
        self.issued: float | None = None  # when ``order`` was issued
        self.ident = os.urandom(6).hex()
        self.waiting: set[int] = set()  # replaced nodes told to wait for the next start
        self.interval, self.vitals, self.outputs, self.on_stall = interval, vitals, outputs, on_stall
        self.stragglers: list[Record] = []
        self._straggle = Straggle()
        self.started = now = time.time()
        self.nodes: dict[int, Record] = {
            n: {"node": n, "host": host if n == own else None, "heard": now if n == own else None,
                "output": now, "bytes": -1, **({"dropped": now} if n in gone else {})} for n in range(nodes)}
        self.verdict: Record | None = None
        self.where = where  # its owner's (e.g. ``stacks.where``): where every rank is, for a verdict (``_placed``)
        self._where: dict[tuple[object, ...], tuple[str, float]] = {}  # verdict -> (its line, when last asked)
        self._asking = False
        self._stop = threading.Event()
        self._sock: socket.socket | None = None

    def start(self) -> str | None:
        """Start listening; returns why it cannot (the port is taken) or None."""
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("", self.port))
        except OSError as exc:
            return f"no stall watch: UDP port {self.port} ({exc})"
        sock.settimeout(min(0.5, self.interval))
        self._sock = sock
        threading.Thread(target=self._run, name="ddpjob-watch", daemon=True).start()
        return None

    def stop(self) -> None:
        self._stop.set()

    def issue(self, order: Mapping[str, object]) -> None:
        """The run's next start (its owner's): answered to every heartbeat from now on."""
        self.order, self.issued, self.hold = dict(order), time.time(), False
        self.waiting.clear()

    def _run(self) -> None:
        assert self._sock is not None
        next_tick = 0.0
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(65535)
                self._heard(data, peer)
            except (OSError, ValueError):
                pass
            if time.time() >= next_tick:
                next_tick = time.time() + self.interval
                self._tick()
        self._sock.close()

    def _heard(self, data: bytes, peer: tuple[str, int]) -> None:
        msg = json.loads(data)
        node = int(msg["node"])
        if node not in self.nodes or node == self.own:
            return
        now = time.time()
        rec = self.nodes[node]
        ident = str(msg.get("id") or "")[:64]
        if ident and ident != rec.get("id"):
            seen = rec.setdefault("ids", [])
            assert isinstance(seen, list)  # the watch's own: a list of the ids heard
            if rec.get("id") and ident not in seen and not rec.get("dropped") and self.on_replaced is not None:
                self.waiting.add(node)
                rec.update(id=ident, replaced=now)
                self.on_replaced(dict(rec))
            elif not rec.get("id"):
                rec["id"] = ident
            if ident not in seen:
                seen.append(ident)
                del seen[:-8]
        rec.update(heard=now, host=str(msg.get("host"))[:255], address=peer[0])
        followed = msg.get("followed")
        if followed and followed != self.ident and self.on_followed is not None:
            on_followed, self.on_followed = self.on_followed, None
            on_followed(dict(rec, followed=str(followed)[:64]))
        if isinstance(msg.get("vitals"), dict):
            rec["vitals"] = msg["vitals"]
        if int(msg.get("bytes", 0)) != rec["bytes"]:
            rec.update(bytes=int(msg.get("bytes", 0)), output=now)
        assert self._sock is not None
        reply: Record = {"w": self.ident, "silent": self._silent(now), **(self.order or {})}
        if node in self.waiting or self.hold:
            reply["wait"] = True
        self._sock.sendto(json.dumps(reply).encode(), peer)

    def _silent(self, now: float) -> float:
        """Seconds since the stalest node of the running start was heard (one dropped since it was issued counts)."""
        return max((now - (number(r["heard"]) or self.started) for r in self.nodes.values() if r["node"] != self.own
                    and not (r.get("dropped") and self.issued and to_float(r["dropped"]) <= self.issued)), default=0.0)

    def _tick(self) -> None:
        now = time.time()
        own = self.nodes[self.own]
        size = _size(self.outputs)
        own["heard"] = now
        if size != own["bytes"]:
            own.update(bytes=size, output=now)
        if self.vitals is not None:
            own["vitals"] = _sampled(self.vitals)
        self._drop(now)
        self.stragglers = self._straggle.judge(self._live(), now)
        if self.verdict is None or self.action == "report":  # reported stalls clear when the node is back
            self.verdict = self._judge(now)
            self._placed(self.verdict)
            if self.verdict is not None and self.action == "fail":
                self.on_stall(str(self.verdict["message"]))
        self._write(now)

    def _placed(self, verdict: Record | None) -> None:
        """The verdict's ``where``, once its owner's ``where`` has answered (in a thread of its own, one
        question at a time), asked again while the verdict stands (every stall timeout, ``WHERE_AGAIN_S`` at
        least): ranks read while they still import say little of where they wait later."""
        if verdict is None or self.where is None:
            return
        key = (verdict.get("kind"), verdict.get("node"), verdict.get("rank"), verdict.get("since"))
        line, asked_at = self._where.get(key, ("", None))
        if line:
            verdict["where"] = line
        now = time.monotonic()
        if self._asking or (asked_at is not None and now - asked_at < max(self.WHERE_AGAIN_S, self.timeout)):
            return
        self._where[key] = (line, now)
        self._asking = True
        asked, nodes, where = dict(verdict), [dict(r) for r in self._live()], self.where

        def ask() -> None:
            try:
                said = where(asked, nodes)
            except Exception as exc:  # noqa: BLE001 - the owner's; the verdict stands without it
                said = f"where each rank is could not be read: {exc}"
            self._where[key] = (said or line, now)
            self._asking = False

        threading.Thread(target=ask, name="ddpjob-where", daemon=True).start()

    def _live(self) -> list[Record]:
        return [rec for rec in self.nodes.values() if not rec.get("dropped")]

    def _drop(self, now: float) -> None:
        """Drop each node heard from before and then not for ``lost_after`` seconds (``on_lost``). A node
        never heard from is left to the stall timeout: it may still be starting (an image to pull)."""
        if self.on_lost is None or not self.lost_after:
            return
        for rec in self._live():
            heard = number(rec["heard"])
            if rec["node"] != self.own and heard is not None and now - heard > self.lost_after:
                rec["dropped"] = now
                self.on_lost(dict(rec))

    def _judge(self, now: float) -> Record | None:
        for rec in self._live():
            heard = number(rec["heard"])
            last = heard if heard is not None else self.started
            if now - last > self.timeout:
                name = f"node {rec['node']}" + (f" ({rec['host']})" if rec["host"] else "")
                said = (f"no heartbeat since {clock(last)}" if heard else
                        f"no heartbeat ever arrived (does the network between the nodes drop UDP to port {self.port}?)")
                return {"node": rec["node"], "host": rec["host"], "kind": "lost", "since": last, "message":
                        f"{name} went silent: {said} ({int(now - last)} s; stall timeout {self.timeout:g} s)"}
        stuck = stuck_ranks(self._live(), now, self.timeout)
        if stuck:
            first = stuck[0]
            return {"node": first["node"], "host": first["host"], "rank": first["rank"], "kind": "stuck",
                    "since": first["since"], "message": str(first["message"]) + (
                        f" (and {len(stuck) - 1} more rank(s))" if len(stuck) > 1 else "")}
        # Quiet counts for the run as a whole: often only the first node prints (rank 0), so one node's
        # silence says nothing, while a hung collective silences every node.
        last = max(number(r["output"]) or 0.0 for r in self._live())
        if now - last > self.timeout:
            stopped = stuck_ranks(self._live(), now, 0.0)  # the run is quiet because a rank stopped
            if stopped:
                first = stopped[0]
                return {"node": first["node"], "host": first["host"], "rank": first["rank"], "kind": "stuck",
                        "since": first["since"], "message": (
                            f"{first['who']} is stopped (SIGSTOP?) since {clock(to_float(first['since']))}, and no node has "
                            f"written output or made progress since {clock(last)} ({int(now - last)} s; stall "
                            f"timeout {self.timeout:g} s)")}
            return {"node": None, "host": None, "kind": "quiet", "since": last, "message":
                    f"no node has written output or made progress since {clock(last)} ({int(now - last)} s; "
                    f"stall timeout {self.timeout:g} s)"}
        return None

    def _write(self, now: float) -> None:
        state: Record = {"updated": now, "timeout": self.timeout, "action": self.action, "interval": self.interval,
                 "nodes": list(self.nodes.values()), "verdict": self.verdict, "stragglers": self.stragglers}
        if self.extra is not None:
            try:
                state.update(self.extra())
            except Exception as exc:  # noqa: BLE001 - the owner's; the watch must go on writing
                state["extra_error"] = repr(exc)[:200]
        tmp = f"{self.state_path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(tmp, self.state_path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class Beacon:
    """Another node's side: tells the first node it lives, and notices when the first node does not answer."""

    def __init__(self, *, addr: str, port: int, node: int, host: str, outputs: list[str], timeout: float,
                 action: str, on_stall: Callable[[str], None], interval: float = INTERVAL_S,
                 vitals: Callable[[], Record] | None = None, lost_after: float | None = None,
                 on_cut: Callable[[str], None] | None = None,
                 on_order: Callable[[Record], None] | None = None,
                 extra: Callable[[], Record] | None = None) -> None:
        self.addr, self.port, self.node, self.host, self.extra = addr, port, node, host, extra
        self.ident = os.urandom(6).hex()  # this runner's: a new one says the node was replaced
        self.lost_after, self.on_cut, self.on_order = lost_after, on_cut, on_order
        self.cut: str | None = None
        self.interval, self.vitals, self.outputs, self.timeout = interval, vitals, outputs, timeout
        self.action, self.on_stall, self.answered, self.ever_answered = action, on_stall, time.time(), False
        self.lost: str | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="ddpjob-beacon", daemon=True).start()

    def follow(self, addr: str) -> None:
        """Send the heartbeats to another first node from now on (the one that took the lost first node's
        place); it is given ``lost_after`` to answer as the first was."""
        self.addr, self.answered, self.cut, self.lost = addr, time.time(), None, None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(self.interval)
            while not self._stop.is_set():
                beat: Record = {"node": self.node, "host": self.host, "bytes": _size(self.outputs),
                                        "id": self.ident, **(self.extra() if self.extra is not None else {})}
                if self.vitals is not None:
                    beat["vitals"] = _sampled(self.vitals)
                msg = json.dumps(beat).encode()
                try:
                    sock.sendto(msg, (self.addr, self.port))
                    reply, _ = sock.recvfrom(65535)
                    self.answered, self.ever_answered = time.time(), True
                    self._ordered(reply)
                    self._stop.wait(self.interval)
                except OSError:  # no answer within the interval, or the network is unreachable
                    self._stop.wait(min(0.2, self.interval))
                now = time.time()
                if self.cut is None and self.lost_after and self.on_cut is not None \
                        and now - self.answered > self.lost_after:
                    self.cut = (f"node {self.node} ({self.host}) was cut off from the first node ({self.addr}): no "
                                f"answer to heartbeats since {clock(self.answered)} ({int(now - self.answered)} s; "
                                f"recovery.lost_after {self.lost_after:g} s)")
                    self.on_cut(self.cut)
                if self.lost is None and now - self.answered > self.timeout:
                    never = "" if self.ever_answered else f"; none ever came: is UDP to port {self.port} dropped?"
                    self.lost = (f"node {self.node} ({self.host}) lost the first node ({self.addr}): no answer to "
                                 f"heartbeats since {clock(self.answered)} ({int(now - self.answered)} s; "
                                 f"stall timeout {self.timeout:g} s{never})")
                    if self.action == "fail":
                        self.on_stall(self.lost)

    def _ordered(self, reply: bytes) -> None:
        try:
            order = json.loads(reply) if self.on_order is not None else None
        except ValueError:
            return
        if isinstance(order, dict) and self.on_order is not None:
            self.on_order(order)


def _sampled(vitals: Callable[[], Record]) -> Record:
    """A node's vitals; a sampler that fails says so rather than stopping the heartbeats."""
    try:
        return vitals()
    except Exception as exc:  # noqa: BLE001 - the heartbeat matters more than the sample
        return {"error": f"vitals not sampled: {type(exc).__name__}: {exc}"}


def stuck_ranks(nodes: Iterable[Mapping[str, object]], now: float, timeout: float) -> list[Record]:
    """The ranks stopped (SIGSTOP, Ctrl-Z, a debugger: state T) for longer than ``timeout``, from the
    nodes' vitals, the longest stopped first: each with node, host, rank, since (a number), who and a
    message (text)."""
    out: list[tuple[float, Record]] = []
    for rec in nodes:
        vitals = rec.get("vitals")
        ranks = vitals.get("ranks") if isinstance(vitals, dict) else None
        for r in ranks if isinstance(ranks, list) else []:
            since = r.get("stopped_since") if isinstance(r, dict) else None
            if isinstance(since, (int, float)) and now - since > timeout:
                where = f"node {rec['node']}" + (f" ({rec['host']})" if rec.get("host") else "")
                who = f"rank {r.get('rank')} (local rank {r.get('local_rank')}, pid {r.get('pid')}) on {where}"
                out.append((since, {"node": rec["node"], "host": rec.get("host"), "rank": r.get("rank"), "since": since,
                                    "who": who, "message": f"{who} is stopped (SIGSTOP?) since {clock(since)} "
                                                           f"({int(now - since)} s; stall timeout {timeout:g} s)"}))
    return [s for _, s in sorted(out, key=lambda s: s[0])]


def report(state: Mapping[str, object], now: float) -> str | None:
    """What ``status`` says about a running run, from the first node's ``watch.json``; None when all is well."""
    verdict = state.get("verdict")
    if isinstance(verdict, dict) and verdict.get("message"):
        ending = "; the job is being ended (stall.action: fail)" if state.get("action") == "fail" else ""
        placed = f"; {verdict['where']}" if verdict.get("where") else ""
        return f"stalled: {verdict['message']}{placed}{ending}"
    stragglers = state.get("stragglers")
    slow = [s["message"] for s in (stragglers if isinstance(stragglers, list) else [])
            if isinstance(s, dict) and s.get("message")]
    if slow:
        return "straggler: " + "; ".join(slow)
    updated = to_float(state.get("updated") or 0)
    if updated and now - updated > to_float(state.get("timeout") or 300):
        return (f"stalled: the first node's watch has said nothing since {clock(updated)} (node 0 lost, "
                "or its node runner stopped)")
    return None
