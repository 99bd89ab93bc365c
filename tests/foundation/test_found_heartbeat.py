"""The stall watch (launcher.targets.shared.heartbeat) on this machine's loopback: real UDP between a
Watch and a Beacon, with a timeout of a second or less instead of the spec's minimum of 20 s.

The scenarios wait on the clock, not the CPU: they all start at once, each in its own thread, the
first time a test asks for one (``running``), and each test waits for its own; together they take
as long as the longest (the pure tier's time, issue 35)."""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import testkit

from launcher.targets.shared import heartbeat

# What these tests wait for is a thread of this process (an attribute, or watch.json, which the watch
# replaces whole): cheap to look at, so looked at every 20 ms, not testkit's 0.2 s.
wait_for = functools.partial(testkit.wait_for, poll=0.02)
_GIVEN: set[int] = set()  # the scenarios run at once: never the same port twice
_GIVING = threading.Lock()


def _free_udp_port() -> int:
    with _GIVING:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port


SCENARIOS: dict[str, Callable[[Path], None]] = {}


def scenario(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    SCENARIOS[fn.__name__] = fn
    return fn


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[None]]]:
    """Every scenario, started at once (each in a folder of its own); a test calls ``.result()`` on its own."""
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        yield {name: pool.submit(fn, tmp_path_factory.mktemp(name)) for name, fn in SCENARIOS.items()}


@scenario
def lost_and_fail_ends_once(tmp_path: Path) -> None:
    port, state = _free_udp_port(), tmp_path / "watch.json"
    out0, log1 = tmp_path / "node-0.log", tmp_path / "node-1.log"
    writing = threading.Event()

    def write() -> None:  # output on both nodes, all along
        step = 0
        while not writing.wait(0.1):
            step += 1
            for path in (out0, log1):
                with path.open("a") as f:
                    f.write(f"step {step}\n")

    threading.Thread(target=write, daemon=True).start()
    ended: list[str] = []
    watch = heartbeat.Watch(port=port, nodes=2, host="n1", outputs=[str(out0)], timeout=1.0, action="fail",
                            state_path=str(state), on_stall=ended.append, interval=0.2)
    assert watch.start() is None
    beacon = heartbeat.Beacon(addr="127.0.0.1", port=port, node=1, host="n2", outputs=[str(log1)], timeout=1.0,
                              action="fail", on_stall=ended.append, interval=0.2)
    beacon.start()
    try:
        heard = wait_for(lambda: state.exists() and (s := json.loads(state.read_text()))["nodes"][1]["heard"] and s,
                         "the watch to hear node 1", timeout=10)
        assert heard["nodes"][1]["host"] == "n2" and heard["verdict"] is None
        assert beacon.lost is None
        beacon.stop()  # node 1 goes silent
        verdict = wait_for(lambda: json.loads(state.read_text())["verdict"], "a verdict", timeout=15)
        assert verdict["kind"] == "lost" and verdict["node"] == 1 and verdict["host"] == "n2", verdict
        assert ended == [verdict["message"]] and verdict["message"].startswith("node 1 (n2) went silent")
        time.sleep(0.6)
        assert len(ended) == 1  # ended once, not at every tick
        report = heartbeat.report(json.loads(state.read_text()), time.time())
        assert report is not None and report.startswith("stalled: node 1 (n2) went silent")
        assert report.endswith("the job is being ended (stall.action: fail)")
    finally:
        writing.set()
        beacon.stop()
        watch.stop()


def test_a_node_whose_heartbeats_stop_is_lost_and_fail_ends_once(running: dict[str, Future[None]]) -> None:
    """Both nodes keep writing output (so neither is *quiet*); node 1's heartbeats stop: it is *lost*."""
    running['lost_and_fail_ends_once'].result()



@scenario
def beacon_gives_up(tmp_path: Path) -> None:
    ended: list[str] = []
    beacon = heartbeat.Beacon(addr="127.0.0.1", port=_free_udp_port(), node=1, host="n2", outputs=[], timeout=0.5,
                              action="fail", on_stall=ended.append, interval=0.2)
    beacon.start()
    try:
        wait_for(lambda: ended, "the beacon to give up", timeout=15)
        assert ended[0].startswith("node 1 (n2) lost the first node (127.0.0.1): no answer to heartbeats since")
    finally:
        beacon.stop()


def test_a_beacon_whose_first_node_never_answers_gives_up(running: dict[str, Future[None]]) -> None:
    running['beacon_gives_up'].result()



@scenario
def report_clears(tmp_path: Path) -> None:
    port, state = _free_udp_port(), tmp_path / "watch.json"
    out = tmp_path / "node-0.log"
    out.write_text("x")
    watch = heartbeat.Watch(port=port, nodes=1, host="n1", outputs=[str(out)], timeout=1.0, action="report",
                            state_path=str(state), on_stall=lambda m: (_ for _ in ()).throw(AssertionError(m)),
                            interval=0.2)
    assert watch.start() is None
    try:
        verdict = wait_for(lambda: state.exists() and json.loads(state.read_text())["verdict"], "a quiet verdict",
                           timeout=15)
        assert verdict["kind"] == "quiet" and verdict["message"].startswith("no node has written output")
        out.write_text("more output")  # progress again: the reported stall clears
        wait_for(lambda: json.loads(state.read_text())["verdict"] is None, "the verdict to clear", timeout=10)
    finally:
        watch.stop()


def test_report_mode_clears_when_the_node_is_back_and_quiet_nodes_are_named(running: dict[str, Future[None]]) -> None:
    running['report_clears'].result()



def test_report_says_nothing_when_well_and_notices_a_watch_gone_quiet():
    now = time.time()
    assert heartbeat.report({"updated": now, "timeout": 20, "verdict": None}, now) is None
    stale = heartbeat.report({"updated": now - 100, "timeout": 20, "verdict": None}, now)
    assert stale is not None and "the first node's watch has said nothing since" in stale


@scenario
def one_silent_node(tmp_path: Path) -> None:
    port, state = _free_udp_port(), tmp_path / "watch.json"
    out0, log1 = tmp_path / "node-0.log", tmp_path / "node-1.log"
    log1.write_text("started\n")
    writing = threading.Event()

    def write() -> None:
        while not writing.wait(0.1):
            with out0.open("a") as f:
                f.write("step\n")

    threading.Thread(target=write, daemon=True).start()
    watch = heartbeat.Watch(port=port, nodes=2, host="n1", outputs=[str(out0)], timeout=1.0, action="report",
                            state_path=str(state), on_stall=lambda m: None, interval=0.2)
    assert watch.start() is None
    beacon = heartbeat.Beacon(addr="127.0.0.1", port=port, node=1, host="n2", outputs=[str(log1)], timeout=1.0,
                              action="report", on_stall=lambda m: None, interval=0.2)
    beacon.start()
    try:
        wait_for(lambda: state.exists() and json.loads(state.read_text())["nodes"][1]["heard"], "node 1 heard", timeout=10)
        seen = []

        def silent_long() -> bool:  # until the watch has judged node 1 silent for 1.5 stall timeouts
            s = json.loads(state.read_text())
            seen.append(s["verdict"])
            return bool(s["updated"] - s["nodes"][1]["output"] > 1.5 * s["timeout"])

        wait_for(silent_long, "the watch to see node 1 silent past the stall timeout", timeout=15, poll=0.1)
        assert seen == [None] * len(seen)
    finally:
        writing.set()
        beacon.stop()
        watch.stop()


def test_one_silent_node_is_not_quiet_while_another_writes(running: dict[str, Future[None]]) -> None:
    """Often only rank 0 prints: node 1 heard but silent while node 0 writes is no stall."""
    running['one_silent_node'].result()
