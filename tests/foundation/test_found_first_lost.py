"""A Slurm run that loses its first node (``slurm/job/recover.py``'s ``elect`` over ``shared/restarts.py``
and ``shared/heartbeat.py``): the lowest other member takes its place when it hears more than half the
run, and a first node that hears half the run or less at once leaves rather than go on alone, so one side
of a split goes on, never two. Real heartbeats on loopback with short intervals; the run itself, on a
real Slurm with its first node's link cut: ``tests/slurm/test_slurm_recovery.py``."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

from test_found_lost_node import LOST_AFTER, _beacon, _port, wait_for  # wait_for: polls every 20 ms

from launcher.targets.shared import heartbeat
from launcher.targets.shared.restarts import Recovery
from launcher.targets.slurm.job import recover
from launcher.targets.slurm.job.recover import elect


def _recovery(path: Path, node: int, nodes: int = 3) -> Recovery:
    return Recovery(node=node, nodes=nodes, hosts=[f"n{i + 1}" for i in range(nodes)], max_losses=10, min_nodes=1,
                    lost_after=LOST_AFTER, path=str(path / "recovery.json"), metrics=None, successor=True)


def _watch(port: int, rec: Recovery, state: Path, *, own: int = 0, hold: bool = False) -> heartbeat.Watch:
    w = heartbeat.Watch(port=port, nodes=rec.nodes, host=f"n{own + 1}", outputs=[], timeout=60, action="report",
                        state_path=str(state), on_stall=lambda m: None, interval=0.1, lost_after=LOST_AFTER,
                        on_lost=rec.lost, own=own, gone=(rec.first,) if hold else (), hold=hold)
    rec.heard = lambda: {r["node"] for r in w.nodes.values()
                         if r["heard"] and time.time() - r["heard"] < LOST_AFTER / 2}
    assert w.start() is None
    return w


def test_the_first_node_lost_the_next_takes_its_place_and_the_run_goes_on_with_it(tmp_path):
    """3 nodes; node 0's runner goes silent for good: nodes 1 and 2 stop hearing it, node 1 listens on
    its own and hears node 2 (2 of 3: a majority), orders start 2 on nodes 1 and 2 as the first node, and
    records node 0's loss after the losses node 0 had recorded; node 2 follows it as rank 1."""
    port = _port()
    first, second, third = _recovery(tmp_path, 0), _recovery(tmp_path, 1), _recovery(tmp_path, 2)
    first.write()
    (tmp_path / "recovery.json").write_text(json.dumps({**first.record(), "losses": [{"node": 3, "at": 1.0}]}))
    watch = _watch(port, first, tmp_path / "watch.json")
    beacons = [_beacon(port, 1, second), _beacon(port, 2, third)]
    try:
        wait_for(lambda: all(r["heard"] for r in watch.nodes.values()), "every node heard", timeout=10)
        watch.stop()  # node 0 is gone (its socket closes: the next watch may take the port)
        wait_for(lambda: second.electing and third.electing, "nodes 1 and 2 to notice", timeout=10)
        assert second.electing["candidate"] == 1 and third.electing["candidate"] == 1
        assert "cut off from the first node" in second.electing["why"]
        log2 = io.BytesIO()
        follower = threading.Thread(target=elect, args=(third, beacons[1], lambda: None, lambda n: "127.0.0.1",
                                                        "127.0.0.1", log2))
        follower.start()
        lead: list[heartbeat.Watch] = []
        log1 = io.BytesIO()
        got, addr = elect(second, beacons[0], lambda: lead.append(_watch(port, second, tmp_path / "w1.json", own=1,
                                                                         hold=True)) or lead[0],
                          lambda n: None, "10.0.0.2", log1)
        assert got is lead[0] and addr == "10.0.0.2" and second.leads and second.first == 1
        start = second.next_start(-9)
        assert start == {"restart": 1, "members": [1, 2]} and second.rank == 0
        record = json.loads((tmp_path / "recovery.json").read_text())
        assert record["first"] == 1 and [x["node"] for x in record["losses"]] == [3, 0], record
        how = record["losses"][-1]["how"]
        assert "cut off from the first node" in how and "node 1 (n2) took its place as the first node" in how, how
        assert "hearing 2 of the run's 3 nodes" in how, how
        lead[0].issue(second.order())
        follower.join(timeout=10)
        assert not follower.is_alive()
        assert third.next_start(-9) == start and third.rank == 1 and third.first == 1 and third.leave is None
        assert b"following it" in log2.getvalue() and b"takes the first node's place" in log1.getvalue()
    finally:
        for b in beacons:
            b.stop()
        for w in lead:
            w.stop()


def test_a_first_node_that_hears_a_minority_at_once_leaves_and_records_no_loss(tmp_path):
    """3 nodes, nodes 1 and 2 silent at once (node 0 is the one cut off, most likely): node 0 leaves the
    run rather than go on alone beside the others, and writes no loss. Of 2 nodes the first goes on
    (half the run, with the first node: the tie goes to it)."""
    port = _port()
    first = _recovery(tmp_path, 0)
    watch = _watch(port, first, tmp_path / "watch.json")
    beacons = [_beacon(port, 1, _recovery(tmp_path / "x", 1)), _beacon(port, 2, _recovery(tmp_path / "x", 2))]
    try:
        wait_for(lambda: all(r["heard"] for r in watch.nodes.values()), "every node heard", timeout=10)
        for b in beacons:
            b.stop()
        wait_for(first.interrupted, "node 0 to decide", timeout=10)
        assert first.leave and "heard 1 of the run's 3 nodes" in first.leave and "cut off from most" in first.leave
        assert first.next_start(-9) is None and not first.losses and not (tmp_path / "recovery.json").exists()
    finally:
        watch.stop()
    port = _port()
    pair = _recovery(tmp_path / "pair", 0, nodes=2)
    watch = _watch(port, pair, tmp_path / "pair-watch.json")
    beacon = _beacon(port, 1, _recovery(tmp_path / "y", 1, nodes=2))
    try:
        wait_for(lambda: all(r["heard"] for r in watch.nodes.values()), "node 1 heard", timeout=10)
        beacon.stop()
        wait_for(pair.interrupted, "node 0 to decide", timeout=10)
        assert pair.leave is None and pair.next_start(-9) == {"restart": 1, "members": [0]}
    finally:
        watch.stop()


def _alone(tmp_path: Path, node: int) -> tuple[Recovery, heartbeat.Beacon]:
    """Node ``node`` of 3 heard by node 0's watch, which then goes for good: it is electing."""
    port = _port()
    first, rec = _recovery(tmp_path, 0), _recovery(tmp_path, node)
    watch = _watch(port, first, tmp_path / "watch.json")
    beacon = _beacon(port, node, rec)
    try:
        wait_for(lambda: watch.nodes[node]["heard"], f"node {node} heard", timeout=10)
    finally:
        watch.stop()
    wait_for(lambda: rec.electing, f"node {node} to notice", timeout=10)
    return rec, beacon


def test_a_node_that_would_take_the_first_nodes_place_but_hears_no_one_leaves(tmp_path, monkeypatch):
    """Node 1 cut off from every node (its own link gone): it stops hearing node 0, listens, hears no
    one (1 of 3) and leaves; it does not start a run of its own. (It listens for 0.5 s here, not the 8 s
    of four heartbeat intervals: the heartbeats here come every 0.1 s, five of them in that time.)"""
    monkeypatch.setattr(recover, "ELECT_S", 0.5)
    second, beacon = _alone(tmp_path, 1)
    lead: list[heartbeat.Watch] = []
    try:
        elect(second, beacon, lambda: lead.append(_watch(_port(), second, tmp_path / "w1.json", own=1, hold=True))
              or lead[0], lambda n: None, "10.0.0.2", io.BytesIO())
        assert second.leave and "heard 1 of the run's 3 nodes: a half or less does not go on" in second.leave
        assert not second.leads and second.next_start(-9) is None
    finally:
        beacon.stop()
        for w in lead:
            w.stop()


def test_a_follower_that_hears_nothing_from_the_new_first_node_leaves(tmp_path):
    """Node 2 follows node 1, which never answers: within lost_after it leaves, naming node 1."""
    third, beacon = _alone(tmp_path, 2)
    try:
        elect(third, beacon, lambda: None, lambda n: "127.0.0.1", "127.0.0.1", io.BytesIO())
        assert third.leave and "(node 1, which was to take the lost first node's place)" in third.leave
        assert third.next_start(-9) is None
    finally:
        beacon.stop()
