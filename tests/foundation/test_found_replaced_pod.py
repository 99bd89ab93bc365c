"""How the pods of a Kubernetes run agree on its starts when a pod is replaced (``shared/restarts.py`` over
``shared/heartbeat.py``, as ``k8s/job/podrun.py`` uses them), with real heartbeats on loopback and
short intervals; and what the first pod's ``watch.json`` tells ``status`` of the losses. The run itself,
through the loopback API server: ``tests/k8s/test_k8s_recovery.py``."""

from __future__ import annotations

import functools
import json
import socket
import time
from pathlib import Path

import testkit

from launcher.targets.shared import heartbeat
from launcher.targets.shared.recovery import goodput, losses
from launcher.targets.shared.restarts import Recovery
from launcher.targets.shared.told import Told

LOST_AFTER = 5.0
# What these tests wait for is a thread of this process (an attribute, or watch.json, which the watch
# replaces whole): cheap to look at, so looked at every 20 ms, not testkit's 0.2 s.
wait_for = functools.partial(testkit.wait_for, poll=0.02)


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recovery(node: int, nodes: int = 2, metrics: str | None = None) -> Recovery:
    return Recovery(node=node, nodes=nodes, hosts=[""] * nodes, max_losses=10, min_nodes=1, lost_after=LOST_AFTER,
                    path=None, metrics=metrics, gone="its pod or link", joining=True)


def _beacon(port: int, node: int, rec: Recovery) -> heartbeat.Beacon:
    b = heartbeat.Beacon(addr="127.0.0.1", port=port, node=node, host=f"pod-{node}", outputs=[], timeout=60,
                         action="report", on_stall=lambda m: None, interval=0.1, lost_after=LOST_AFTER,
                         on_cut=rec.cut, on_order=rec.ordered, extra=rec.beat)
    b.start()
    return b


def _watch(port: int, rec: Recovery, tmp_path: Path, nodes: int = 2) -> heartbeat.Watch:
    watch = heartbeat.Watch(port=port, nodes=nodes, host="pod-0", outputs=[], timeout=60, action="report",
                            state_path=str(tmp_path / "watch.json"), on_stall=lambda m: None, interval=0.1,
                            lost_after=LOST_AFTER, on_lost=rec.lost, on_replaced=rec.replaced,
                            on_followed=rec.first_replaced, extra=Told(rec).state)
    watch.issue(rec.order())
    assert watch.start() is None
    return watch


def test_a_recreated_pod_waits_for_the_start_that_takes_it_in_and_every_pod_starts_again(tmp_path):
    """Pod 1 joins the run's first start; its pod is deleted and recreated: the new runner (a new id) is
    told to wait, the first pod decides a start on both nodes (a loss, replaced), and once it issues it
    the old members and the new runner all take start 2, the new one as rank 1."""
    port = _port()
    first, second = _recovery(0), _recovery(1)
    watch = _watch(port, first, tmp_path)
    beacons = [_beacon(port, 1, second)]
    try:
        assert second.join(10) and second.restart == 0 and second.members == [0, 1] and not second.interrupted()
        beacons[0].stop()  # the pod is deleted ...
        time.sleep(0.3)
        new = _recovery(1)
        beacons.append(_beacon(port, 1, new))  # ... and recreated: its runner speaks with a new id
        wait_for(first.interrupted, "the first pod to hear the replaced node", timeout=10)
        time.sleep(0.5)
        assert not new.join(0) and not new.interrupted(), "the new runner waits for the start that takes it in"
        start = first.next_start(1)
        assert start == {"restart": 1, "members": [0, 1]} and first.losses[-1]["replaced"] is True
        assert first.losses[-1]["host"] == "pod-1" and "its node runner started again" in first.losses[-1]["how"]
        watch.issue(first.order())
        assert new.join(10) and (new.restart, new.members, new.rank, new.leave) == (1, [0, 1], 1, None)
        time.sleep(0.5)
        assert watch.nodes[1]["id"] == beacons[1].ident and len(first.losses) == 1  # heard again: no new loss
    finally:
        for b in beacons:
            b.stop()
        watch.stop()


def test_a_runner_that_starts_with_the_run_joins_its_first_start_and_one_left_out_leaves(tmp_path):
    port = _port()
    first = _recovery(0, nodes=3)
    watch = _watch(port, first, tmp_path, nodes=3)
    late = _recovery(2, nodes=3)
    beacon = _beacon(port, 2, late)
    try:
        assert late.join(10) and late.restart == 0 and late.leave is None  # a pod slow to start: not a replacement
        first.lost({"node": 1, "heard": time.time() - 9})
        assert first.next_start(-9) == {"restart": 1, "members": [0, 2]}
        watch.issue(first.order())
        wait_for(late.interrupted, "node 2 to hear the new start", timeout=10)
        assert late.next_start(1) == {"restart": 1, "members": [0, 2]} and late.rank == 1
        gone = _recovery(1, nodes=3)  # node 1's pod comes back after the run went on without it
        b1 = _beacon(port, 1, gone)
        try:
            assert gone.join(10) and gone.leave == "node 1 (node 1) is not in the run (start 2)"
        finally:
            b1.stop()
    finally:
        beacon.stop()
        watch.stop()


def test_a_new_first_pod_makes_every_other_pod_start_again_with_it(tmp_path):
    """The first pod itself recreated: its new watch answers with a new id, and the others start again
    (their torchrun had the old first pod's store); the new watch's later starts still reach them."""
    port = _port()
    old = _recovery(0)
    watch = _watch(port, old, tmp_path)
    second = _recovery(1)
    beacon = _beacon(port, 1, second)
    try:
        assert second.join(10) and not second.interrupted()
        watch.stop()
        old = watch._sock
        assert old is not None
        wait_for(lambda: old.fileno() == -1, "the old watch's socket to close", timeout=10, poll=0.02)
        new_first = _recovery(0)
        watch = _watch(port, new_first, tmp_path)
        wait_for(second.interrupted, "node 1 to hear the new first pod", timeout=10)
        assert second.next_start(1) == {"restart": 1, "members": [0, 1]} and second.rank == 1
        # Node 1 says whom it followed before: the new first pod tells the loss of node 0 (once).
        wait_for(lambda: new_first.losses, "the new first pod to learn it replaced node 0", timeout=10)
        time.sleep(0.3)
        (loss,) = new_first.losses
        assert loss["node"] == 0 and loss["replaced"] is True and loss["back_at"] == loss["at"] == new_first.started
        assert "the first node's runner started again" in loss["how"] and "node 1 had followed the old one" in loss["how"]
        new_first.replaced({"node": 1, "host": "pod-1"})  # and a later start of the new watch still counts
        assert new_first.next_start(0) == {"restart": 1, "members": [0, 1]}
        watch.issue(new_first.order())
        wait_for(second.interrupted, "node 1 to hear the new watch's next start", timeout=10)
        assert second.next_start(1) == {"restart": 2, "members": [0, 1]}
        assert [loss["node"] for loss in new_first.losses] == [0, 1]
    finally:
        beacon.stop()
        watch.stop()


def _one_loss(tmp_path, t0: float, *, reached: int, resumed: int, last: int, torn: str = "") -> tuple[Recovery, list]:
    """A run's first pod's recovery and its metrics file (written, ``torn``: a line cut short at its end):
    steps 1 to ``reached`` a second apart (a checkpoint every 10), node 1 lost 5 s later and back 5 s after
    that, the program resumed from step ``resumed`` 5 s after that and stepped on to ``last``; every event."""
    lines = [{"event": "step", "step": s, "time": t0 + 2 + s} for s in range(1, reached + 1)]
    lines += [{"event": "checkpoint", "step": s, "time": t0 + 2 + s + 0.1} for s in range(10, reached, 10)]
    lines.sort(key=lambda e: e["time"])
    rec = _recovery(0, metrics=str(tmp_path / "metrics.jsonl"))
    rec.started = t0
    rec.losses.append({"node": 1, "host": "pod-1", "at": t0 + reached + 5, "how": "its node runner started again",
                       "nodes": 2, "replaced": True, "back_at": t0 + reached + 10})
    after = [{"event": "resume", "step": resumed, "checkpoint_step": resumed, "time": t0 + reached + 15},
             *({"event": "step", "step": s, "time": t0 + reached + 15 + s - resumed} for s in range(resumed + 1, last + 1))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines + after) + torn)
    return rec, lines + after


def test_watch_json_tells_the_losses_and_where_the_program_resumed(tmp_path):
    """The first pod's watch.json carries the recovery's record and the metrics lines that tell the loss
    (no shared filesystem on Kubernetes): status computes the same Loss and goodput from them as from
    the file itself."""
    t0 = time.time() - 100
    rec, all_events = _one_loss(tmp_path, t0, reached=40, resumed=30, last=60, torn='{"event": "step", "st')
    told = Told(rec)
    state = json.loads(json.dumps(told.state()))
    want, got = losses(rec.losses, all_events), losses(state["recovery"]["losses"], state["events"])
    assert got == want and got[0].resumed_step == 30 and got[0].reached_step == 40, (got, want)
    now = t0 + 90
    assert goodput(t0, None, got, state["events"], now) == goodput(t0, None, want, all_events, now) is not None
    assert len(state["events"]) < 10  # not the file: its first step, the resume and its neighbours, checkpoints


def test_the_first_pods_last_line_tells_the_losses_of_a_run_whose_pods_are_gone(tmp_path, monkeypatch):
    """As the first pod's runner ends it prints its run's losses (``Told.final``, ``podrun.TOLD_LINE``):
    the metrics file read to its end however far behind the watch was, of its checkpoints only the one
    the resume names; status computes the same Loss and goodput from it as from the file itself."""
    t0 = time.time() - 1000
    rec, all_events = _one_loss(tmp_path, t0, reached=300, resumed=290, last=399)
    told = Told(rec)
    monkeypatch.setattr(Told, "CHUNK", 4096)  # the watch read a part only; the last line reads the rest
    assert told.state()["events"][-1]["time"] < t0 + 300
    final = json.loads(json.dumps(told.final()))
    want, got = losses(rec.losses, all_events), losses(final["recovery"]["losses"], final["events"])
    assert got == want and got[0].resumed_step == 290 and got[0].first_step_at == t0 + 25 + 291, (got, want)
    end = t0 + 430
    assert goodput(t0, end, got, final["events"], end) == goodput(t0, end, want, all_events, end) is not None
    assert [e["step"] for e in final["events"] if e["event"] == "checkpoint"] == [290]
    assert len(json.dumps(final)) < 4000, len(json.dumps(final))
