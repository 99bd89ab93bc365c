"""Multi-node DDP on Slurm nodes that are really apart (``slurm/cluster.sh up --apart``): each node in
its own network namespace with its own address on a private bridge, so the rendezvous, Gloo's
interface and the ranks' own addresses are those of separate machines, never loopback.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from test_slurm_target import RECORD, records, status, submit, wait_for, write_spec
from testkit import wait_for as wait_for_value
from testkit import wait_for_no_job_processes

pytestmark = [pytest.mark.slurm, pytest.mark.real]


# The cut-link tests' stall timeout: below the spec's 20 s minimum through the test-only floor (5
# heartbeat intervals of 2 s; the spec's minimum would cost CI 10 s more for each).
STALL_S = 10


@pytest.fixture(autouse=True)
def _slurm_env(apart_cluster, monkeypatch):
    for key, value in {**apart_cluster.env, "DDPJOB_TEST_STALL_MIN_S": str(STALL_S)}.items():
        monkeypatch.setenv(key, value)
    return apart_cluster


def _node_records(job_dir: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(job_dir) / "task-0").glob("node-[0-9].json"))]


def test_ranks_on_two_addresses_meet_at_the_first_nodes_address(apart_cluster, cli, tmp_path):
    """2 nodes x 2 processes: every rank reports its own node's bridge address, MASTER_ADDR is n1's
    bridge address (not loopback) on both nodes, Gloo uses eth0, and the all_reduce over 4 ranks is right."""
    addresses = apart_cluster.addresses
    spec = write_spec(tmp_path, "apart", ["python", RECORD, "--allreduce"], procs_per_node=2)
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    recs = records(Path(data["handle"]["job_dir"]) / "output")
    assert [r["rank"] for r in recs] == [0, 1, 2, 3]
    assert {r["allreduce_sum"] for r in recs} == {6.0}  # 0 + 1 + 2 + 3 on every rank
    for r in recs:
        assert r["addr"] == addresses[r["host"]], r  # its own node's address, toward the rendezvous
        master = r["master"].rsplit(":", 1)[0]
        assert master == addresses["n1"] and not ipaddress.ip_address(master).is_loopback, r
        assert r["gloo_ifname"] == "eth0", r
    assert {r["addr"] for r in recs} == {addresses["n1"], addresses["n2"]}  # two hosts, two addresses
    nodes = _node_records(data["handle"]["job_dir"])
    assert [(n["host"], n["address"], n["interface"], n["master_addr"]) for n in nodes] == [
        ("n1", addresses["n1"], "eth0", addresses["n1"]), ("n2", addresses["n2"], "eth0", addresses["n1"])]
    # Each node names the other's address (cluster.sh's hosts files), so torch's store never warns that
    # it cannot name a client ("err=-3").
    for log in (Path(data["handle"]["job_dir"]) / "task-0").glob("node-*.log"):
        assert "err=-3" not in log.read_text(errors="replace"), log


def test_an_interface_no_node_has_fails_at_once_naming_node_and_interfaces(apart_cluster, cli, tmp_path):
    """nccl.socket_ifname: nosuch0 ends the job before torchrun starts (not in a rendezvous timeout,
    15 minutes by default), with the node, the name asked for and the interfaces the node has."""
    spec = write_spec(tmp_path, "noif", ["python", RECORD, "--allreduce"], nccl={"socket_ifname": "nosuch0"})
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=90)
    assert data["status"]["state"] == "FAILED", data["status"]
    message = data["status"]["message"]
    assert "nosuch0" in message and "matches no interface" in message, message
    assert any(f"eth0 {a}" in message for a in apart_cluster.addresses.values()), message
    assert "lo 127.0.0.1" in message and ("(n1)" in message or "(n2)" in message), message
    assert not records(Path(data["handle"]["job_dir"]) / "output")  # no rank ever started
    text = cli("status", job_id, timeout=60).stdout
    assert "nosuch0" in text, text


def test_an_nccl_style_exclusion_becomes_gloos_exact_names(apart_cluster, cli, tmp_path):
    """'^lo' is NCCL's form (all but lo); Gloo takes exact names only: each node hands Gloo 'eth0'."""
    spec = write_spec(tmp_path, "excl", ["python", RECORD, "--allreduce"], nccl={"socket_ifname": "^lo"})
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    recs = records(Path(data["handle"]["job_dir"]) / "output")
    assert {r["gloo_ifname"] for r in recs} == {"eth0"} and {r["allreduce_sum"] for r in recs} == {1.0}
    assert status(cli, job_id)["state"] == "SUCCEEDED"


LOOP = """
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.zeros(1)
for step in range(100000):
    dist.all_reduce(t)
    print("step", step, flush=True)
    time.sleep(0.5)
"""


def _running_with_output(cli, job_id: str) -> dict:
    """The job RUNNING, with every rank past its first all_reduce (both nodes print steps)."""
    def ready():
        data = status(cli, job_id)
        if data["status"]["state"] != "RUNNING":
            return None
        logs = [p.read_text(errors="replace") for p in (Path(data["handle"]["job_dir"]) / "task-0").glob("node-*.log")]
        return data if len(logs) == 2 and all("step 3" in log for log in logs) else None
    return wait_for_value(ready, "both nodes to print steps", timeout=180)


def test_a_node_cut_off_is_named_and_the_job_ends_when_the_spec_says_fail(apart_cluster, cli, tmp_path, cut, ddpjob_home):
    """n2's link is cut while the ranks all_reduce: with stall {timeout: STALL_S, action: fail} the job ends
    FAILED naming node 1 (n2), within the timeout plus 30 s, and no process of the job is left once
    the link is back (n2's own runner stopped its ranks when the first node stopped answering)."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    spec = write_spec(tmp_path, "cutfail", ["python", str(script)], stall={"timeout": STALL_S, "action": "fail"})
    job_id = submit(cli, str(spec))
    data = _running_with_output(cli, job_id)
    job_dir = Path(data["handle"]["job_dir"])
    watch = json.loads((job_dir / "task-0" / "watch.json").read_text())
    assert watch["timeout"] == STALL_S and watch["verdict"] is None and {n["host"] for n in watch["nodes"]} == {"n1", "n2"}
    cut("n2")
    failed = wait_for_value(lambda: (d := status(cli, job_id))["state"] == "FAILED" and d, "the job to end FAILED",
                            timeout=STALL_S + 30 + 10)
    # Both sides of the cut judge it at the same moment (the same timeout): the first node that n2 went
    # silent, n2 that it lost the first node; the status names the verdict recorded first.
    message = failed["status"]["message"]
    assert message.startswith(("node 1 (n2) went silent: no heartbeat since",
                               f"node 1 (n2) lost the first node ({apart_cluster.addresses['n1']}): no answer to "
                               "heartbeats since")), message
    assert f"stall timeout {STALL_S} s" in message, message
    text = cli("status", job_id, timeout=60).stdout
    assert message.split(":")[0] in text, text
    # n2, cut off, stops its own ranks too: it lost the first node.
    n2 = wait_for_value(lambda: (r := json.loads((job_dir / "task-0" / "node-1.json").read_text())).get("error") and r,
                        "n2's runner to give up", timeout=60)
    assert n2["error"].startswith("node 1 (n2) lost the first node"), n2
    # FAILED means Slurm no longer holds the allocation: the first node's runner cancelled the job, so
    # n1 is free at once; n2, cut off, is only "completing" until Slurm reaches it again.
    jid = failed["handle"]["slurm_job_id"]

    def squeue() -> list[str]:
        return apart_cluster.run("squeue", "-h", "-j", jid, "-o", "%T", check=False).stdout.split()

    assert set(squeue()) <= {"COMPLETING"}, squeue()
    assert "cancelling Slurm job" in (job_dir / "task-0" / "node-0.log").read_text()
    apart_cluster.script("link", "n2", "up")
    wait_for_value(lambda: not squeue(), "squeue to list the job no more", timeout=30)
    wait_for_no_job_processes(ddpjob_home, "the stall ended the job", timeout=90)


def test_a_silent_node_is_reported_and_the_job_runs_on_by_default(apart_cluster, cli, tmp_path, cut, ddpjob_home):
    """stall.action report (the default): status and list name the silent node while the job stays
    RUNNING; cancel then leaves no process, on the cut node too once it is back."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    spec = write_spec(tmp_path, "cutreport", ["python", str(script)], stall={"timeout": STALL_S})
    job_id = submit(cli, str(spec))
    _running_with_output(cli, job_id)
    cut("n2")
    data = wait_for_value(lambda: "went silent" in (d := status(cli, job_id))["status"]["message"] and d,
                          "status to name the silent node", timeout=STALL_S + 30 + 10)
    assert data["status"]["state"] == "RUNNING"
    assert data["status"]["message"].startswith("stalled: node 1 (n2) went silent"), data["status"]
    listed = cli("list", timeout=60).stdout
    assert "node 1 (n2) went silent" in listed, listed
    assert cli("cancel", job_id, timeout=120).returncode == 0
    apart_cluster.script("link", "n2", "up")
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel", timeout=120)


def test_doctor_reports_each_nodes_address_and_interfaces(apart_cluster, cli, tmp_path):
    """ddpjob doctor across the apart nodes: every rank's own address toward the rendezvous is its
    node's bridge address, on eth0, and the text has one line per node with its interfaces."""
    spec = write_spec(tmp_path, "doc", ["python"])
    proc = cli("doctor", str(spec), "--target", "slurm", "--max-mib", "4", "--iters", "1", "-o", "json",
               cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    addresses = apart_cluster.addresses
    assert sorted((r["host"], r["address"], r["interface"]) for r in report["ranks"]) == [
        ("n1", addresses["n1"], "eth0"), ("n2", addresses["n2"], "eth0")]
    assert {r["master_ip"] for r in report["ranks"]} == {addresses["n1"]}
    assert all(r["addresses"] == {"eth0": addresses[r["host"]], "lo": "127.0.0.1"} for r in report["ranks"])
    from launcher.doctor.run import render

    text = "\n".join(render(report, report["verdict"]))
    for node in ("n1", "n2"):
        assert (f"node {node}: to the rendezvous {addresses['n1']} from {addresses[node]} via eth0; "
                f"interfaces eth0 {addresses[node]}, lo 127.0.0.1") in text, text
