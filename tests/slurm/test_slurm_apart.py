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

pytestmark = [pytest.mark.slurm, pytest.mark.real]


@pytest.fixture(autouse=True)
def _slurm_env(apart_cluster, monkeypatch):
    for key, value in apart_cluster.env.items():
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
    assert {r["addr"] for r in recs} == set(addresses.values())  # two hosts, two addresses
    nodes = _node_records(data["handle"]["job_dir"])
    assert [(n["host"], n["address"], n["interface"], n["master_addr"]) for n in nodes] == [
        ("n1", addresses["n1"], "eth0", addresses["n1"]), ("n2", addresses["n2"], "eth0", addresses["n1"])]


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
