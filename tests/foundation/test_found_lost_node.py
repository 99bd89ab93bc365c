"""How a Slurm run decides that it lost a node and goes on without it (``slurm/job/recover.py`` over
``shared/heartbeat.py``), with real heartbeats on loopback and short intervals; and how ``status`` tells
such a run from the first node's ``recovery.json``. The run itself, on a real Slurm with nodes apart:
``tests/slurm/test_slurm_recovery.py``."""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from pathlib import Path

import testkit

from launcher.core.states import JobState
from launcher.targets.shared import heartbeat
from launcher.targets.shared.restarts import Recovery
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm import status as slurm_status
from launcher.targets.slurm.payload import SlurmHandle
from launcher.targets.slurm.query import SlurmRecord, parse_sacct

LOST_AFTER = 0.8
# What these tests wait for is a thread of this process (an attribute, or watch.json, which the watch
# replaces whole): cheap to look at, so looked at every 20 ms, not testkit's 0.2 s.
wait_for = functools.partial(testkit.wait_for, poll=0.02)


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recovery(tmp_path: Path, node: int, nodes: int = 3, **kw: int) -> Recovery:
    return Recovery(node=node, nodes=nodes, hosts=[f"n{i + 1}" for i in range(nodes)], max_losses=kw.get("max_losses", 10),
                    min_nodes=kw.get("min_nodes", 1), lost_after=LOST_AFTER, path=str(tmp_path / "recovery.json"),
                    metrics=str(tmp_path / "metrics.jsonl"))


def _beacon(port: int, node: int, rec: Recovery) -> heartbeat.Beacon:
    b = heartbeat.Beacon(addr="127.0.0.1", port=port, node=node, host=f"n{node + 1}", outputs=[], timeout=60,
                         action="report", on_stall=lambda m: None, interval=0.1, lost_after=LOST_AFTER,
                         on_cut=rec.cut, on_order=rec.ordered)
    b.start()
    return b


def test_a_silent_node_is_dropped_the_others_start_again_and_a_dropped_node_leaves(tmp_path):
    """3 nodes; node 2's heartbeats stop: the watch drops it once (not judged any more), the first node's
    recovery decides the next start on nodes 0 and 1 and records the loss; the order reaches node 1,
    which starts again as rank 1, and node 2, when it is heard again, is told it left the run."""
    port = _port()
    first, second, third = _recovery(tmp_path, 0), _recovery(tmp_path / "n1", 1), _recovery(tmp_path / "n2", 2)
    lost: list[dict] = []

    def on_lost(rec: dict) -> None:
        lost.append(rec)
        first.lost(rec)

    watch = heartbeat.Watch(port=port, nodes=3, host="n1", outputs=[], timeout=60, action="report",
                            state_path=str(tmp_path / "watch.json"), on_stall=lambda m: None, interval=0.1,
                            lost_after=LOST_AFTER, on_lost=on_lost)
    assert watch.start() is None
    beacons = [_beacon(port, 1, second), _beacon(port, 2, third)]
    try:
        wait_for(lambda: all(r["heard"] for r in watch.nodes.values()), "every node heard", timeout=10)
        beacons[1].stop()  # node 2 goes silent
        wait_for(first.interrupted, "the first node to decide", timeout=10)
        assert [r["node"] for r in lost] == [2]
        start = first.next_start(-9)
        assert start == {"restart": 1, "members": [0, 1]} and first.rank == 0
        (loss,) = json.loads((tmp_path / "recovery.json").read_text())["losses"]
        assert loss["node"] == 2 and loss["host"] == "n3" and loss["nodes"] == 2 and not loss["replaced"], loss
        assert "no heartbeat from its node runner since" in loss["how"] and "recovery.lost_after 0.8 s" in loss["how"]
        watch.issue(start)
        wait_for(second.interrupted, "node 1 to hear the new start", timeout=10)
        assert second.next_start(1) == start and second.rank == 1 and second.leave is None
        # Node 2 comes back: the watch answers it the order, which leaves it out.
        beacons.append(_beacon(port, 2, third))
        wait_for(lambda: third.leave, "node 2 to learn it left", timeout=10)
        assert third.leave == "node 2 (n3) is no longer in the run (start 2)" and third.next_start(0) is None
        # And goes silent again: a watch that still judged it would drop it a second time once lost_after
        # has passed (while it beats, its heard time is fresh and nothing could be dropped).
        beacons[2].stop()
        time.sleep(LOST_AFTER + 0.6)  # lost_after, and six of the watch's 0.1 s ticks to spare
        assert [r["node"] for r in lost] == [2]  # dropped once; node 2 is not judged or dropped again
        state = json.loads((tmp_path / "watch.json").read_text())
        assert state["verdict"] is None and state["nodes"][2]["dropped"]
    finally:
        for b in beacons:
            b.stop()
        watch.stop()


def test_a_node_whose_program_failed_ends_once_the_first_node_has_heard_every_member_since(tmp_path, monkeypatch):
    """Node 1's torchrun fails by itself (its program's error) while every node beats: its runner ends its
    part of the run (no next start) once the first node's answers, a while after the failure, say every
    member was heard lately, not lost_after later (a Slurm job with a failing rank on node 1 took 36 s
    more to end). With node 2 silent at that time (a loss in the making: the failure may be its peers
    going away) it waits for the first node's order and starts again without node 2."""
    from launcher.targets.shared import restarts

    monkeypatch.setattr(restarts, "INTERVAL_S", 0.25)  # "a while": 3 intervals and 1 s (1.75 s here, 7 s in a job)
    # How long node 1 may wait (lost_after and 3 intervals: 4.75 s); the watch drops a silent node sooner
    # here (2 s; in a job both are recovery.lost_after) so that its order has time to spare.
    lost_after, dropped_after = 4.0, 2.0
    first, second, third = (Recovery(node=n, nodes=3, hosts=["n1", "n2", "n3"], max_losses=10, min_nodes=1,
                                     lost_after=lost_after, path=str(tmp_path / f"recovery-{n}.json"), metrics=None)
                            for n in range(3))
    port = _port()
    watch = heartbeat.Watch(port=port, nodes=3, host="n1", outputs=[], timeout=60, action="report",
                            state_path=str(tmp_path / "watch.json"), on_stall=lambda m: None, interval=0.1,
                            lost_after=dropped_after, on_lost=first.lost)
    assert watch.start() is None
    beacons = [_beacon(port, 1, second), _beacon(port, 2, third)]
    try:
        wait_for(lambda: all(r["heard"] for r in watch.nodes.values()), "every node heard", timeout=10)
        t0 = time.monotonic()
        assert second.next_start(1) is None and second.leave is None and not first.losses
        took = time.monotonic() - t0
        assert 1.75 <= took < lost_after, f"node 1 ended its part {took:.2f} s after its failure"

        beacons[1].stop()  # node 2 goes silent as node 1's torchrun fails; once dropped, it still counts as
        # silent until the first node orders the next start (the answers said 0 s between the two: a bug)
        started: list[object] = []

        def lead() -> None:  # the first node's runner: it stops its torchrun (a moment), orders the next start
            wait_for(first.interrupted, "the first node to decide", timeout=10)
            time.sleep(1.0)
            start = first.next_start(-9)
            started.append(start)
            watch.issue(start)

        leader = threading.Thread(target=lead)
        leader.start()
        assert second.next_start(1) == {"restart": 1, "members": [0, 1]} and second.rank == 1
        leader.join(timeout=10)
        assert started == [{"restart": 1, "members": [0, 1]}]
    finally:
        for b in beacons:
            b.stop()
        watch.stop()


def test_a_node_that_hears_nothing_from_the_first_node_leaves_the_run(tmp_path):
    rec = _recovery(tmp_path, 1)
    beacon = _beacon(_port(), 1, rec)  # nobody listens there
    try:
        wait_for(lambda: rec.leave, "the node to leave", timeout=10)
    finally:
        beacon.stop()
    assert rec.leave.startswith("node 1 (n2) was cut off from the first node (127.0.0.1): no answer to heartbeats since")
    assert rec.leave.endswith("it stopped its ranks and left the run") and rec.next_start(-9) is None


def test_losses_past_the_budget_or_below_the_minimum_end_the_run_saying_so(tmp_path):
    budget = _recovery(tmp_path / "a", 0, max_losses=1)
    (tmp_path / "a").mkdir()
    budget.lost({"node": 1, "heard": time.time() - 1})
    assert budget.next_start(-9) == {"restart": 1, "members": [0, 2]} and budget.failed is None
    budget.lost({"node": 2, "heard": time.time() - 1})
    assert budget.next_start(-9) is None
    assert budget.failed.startswith("node 2 (n3) was lost: no heartbeat")
    assert budget.failed.endswith("not brought back: the run had lost 1 node(s) before, and recovery.max_losses is 1")

    minimum = _recovery(tmp_path / "b", 0, min_nodes=3)
    (tmp_path / "b").mkdir()
    minimum.lost({"node": 1, "heard": time.time() - 1})
    assert minimum.next_start(-9) is None
    assert minimum.failed.endswith("not brought back: 2 node(s) left, fewer than recovery.min_nodes (3)")


def test_two_losses_before_the_next_start_make_one_start_without_both(tmp_path):
    rec = _recovery(tmp_path, 0, nodes=4)
    rec.lost({"node": 1, "heard": time.time() - 1})
    rec.lost({"node": 3, "heard": time.time() - 1})
    rec.lost({"node": 3, "heard": time.time() - 1})  # told twice: counted once
    assert rec.next_start(-9) == {"restart": 1, "members": [0, 2]}
    assert [loss["node"] for loss in rec.losses] == [1, 3]


def test_an_old_or_malformed_order_changes_nothing(tmp_path):
    rec = _recovery(tmp_path, 1)
    for order in ({"restart": 0, "members": [0, 1]}, {"restart": "1", "members": [0, 1]}, {"restart": 1},
                  {"restart": 1, "members": ["0"]}):
        rec.ordered(order)
    assert not rec.interrupted() and rec.pending is None
    rec.ordered({"restart": 2, "members": [1, 0]})
    rec.ordered({"restart": 1, "members": [0, 1, 2]})  # older than the one pending
    assert rec.next_start(0) == {"restart": 2, "members": [1, 0]} and rec.rank == 0


def _handle(tmp_path: Path) -> SlurmHandle:
    return SlurmHandle(job_id="j", run_dir=str(tmp_path / "run"), slurm_job_id="77", nodes=2, job_dir=str(tmp_path))


def _write(tmp_path: Path, recovery: dict, nodes: list[dict]) -> None:
    task = RunFolder(str(tmp_path)).task(0)
    Path(task.path).mkdir(parents=True, exist_ok=True)
    Path(task.recovery).write_text(json.dumps(recovery))
    for n in nodes:
        Path(task.record(n["node"])).write_text(json.dumps(n))


def test_status_tells_a_recovered_run_by_its_outcome_not_by_the_step_slurm_saw_cancelled(tmp_path):
    now = time.time()
    loss = {"node": 1, "host": "n2", "at": now - 50, "how": "no heartbeat from its node runner since ...", "nodes": 1,
            "replaced": False, "back_at": now - 45}
    recovery = {"restart": 1, "members": [0], "hosts": ["n1", "n2"], "losses": [loss], "started": now - 100,
                "metrics": str(tmp_path / "none.jsonl")}
    nodes = [{"node": 0, "host": "n1", "state": "running", "start": 1}, {"node": 1, "host": "n2", "state": "running"}]
    _write(tmp_path, recovery, nodes)
    running = slurm_status.job_status(_handle(tmp_path), {"77": SlurmRecord("77", "RUNNING")})
    assert running.state == JobState.RUNNING
    assert running.message == "recovered: 1 lost node(s) brought back", running.message
    assert [n.fields["state"] for n in running.tasks[0].nodes] == ["running", "lost"]
    (told,) = running.tasks[0].losses
    assert told.node == 1 and told.back_at == loss["back_at"]

    _write(tmp_path, {**recovery, "outcome": "succeeded", "ended": now}, nodes)
    ending = slurm_status.job_status(_handle(tmp_path), {"77": SlurmRecord("77", "RUNNING")})
    assert ending.state == JobState.RUNNING and ending.message.startswith("ending: the run ended after its losses")
    done = slurm_status.job_status(_handle(tmp_path), {"77": SlurmRecord("77", "FAILED", exit_code="9:0")})
    assert done.state == JobState.SUCCEEDED and done.message == "recovered: 1 lost node(s) brought back", done.message

    why = "node 1 (n2) was lost: ...; not brought back: 0 node(s) left, fewer than recovery.min_nodes (2)"
    _write(tmp_path, {**recovery, "outcome": "failed", "reason": why, "ended": now}, nodes)
    failed = slurm_status.job_status(_handle(tmp_path), {"77": SlurmRecord("77", "CANCELLED")})
    assert failed.state == JobState.FAILED and failed.message.startswith(why), failed.message


def test_sacct_after_a_shrink_reads_the_jobs_last_record():
    """A job dropped from 2 nodes to 1 has a RESIZING record before its own (``sacct -X``)."""
    text = "77|RESIZING|0:0|n[1-2]|None\n77|FAILED|9:0|n1|None\n"
    assert parse_sacct(text)["77"].state == "FAILED"
