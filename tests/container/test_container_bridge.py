"""``local.network: bridge`` with a real engine (podman), real torchrun and gloo: each node's
container at its own address on the job's own internal network, node 0's the rendezvous, and
nothing left (containers, network) after the job ends, fails or is cancelled. Skipped with the
reason where podman's bridge networking cannot work here (see conftest.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
from pathlib import Path

import pytest
from enginekit import job_containers, job_networks, podman
from test_container_engine import ddpjob, job_processes, status, submit, wait_end
from testkit import FAILER, SLEEPER, wait_for

from launcher.core.errors import SubmitRejected
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.local import network
from launcher.targets.local.container import LocalInputs
from launcher.targets.local.target import LocalTarget
from launcher.targets.shared import procs

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

ADDRESSES = '''
import json, os, socket
import torch, torch.distributed as dist
dist.init_process_group("gloo")
# The address this container reaches the rendezvous from (a UDP connect sends nothing).
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((os.environ["MASTER_ADDR"], 9))
own = s.getsockname()[0]
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, own)
with open("/proc/net/route") as f:
    routes = [line.split()[1] for line in f.read().splitlines()[1:]]
rec = {k: os.environ.get(k) for k in ("RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
rec.update(own=own, everyone=everyone, routes=routes, ifaces=sorted(os.listdir("/sys/class/net")))
rec["names"] = [socket.gethostbyaddr(a)[0] for a in everyone]  # what torch's store asks of each client
rec["mapped"] = [socket.getnameinfo(("::ffff:" + a, 0), socket.NI_NAMEREQD)[0] for a in everyone]  # as it asks
rec["resolved"] = [sorted({i[4][0] for i in socket.getaddrinfo("node%d" % n, None)}) for n in range(len(everyone))]
out = os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "rank%d.json" % dist.get_rank())
with open(out, "w") as f:
    json.dump(rec, f)
print("rank", dist.get_rank(), "at", own, flush=True)
dist.destroy_process_group()
'''


def home() -> Path:
    return Path(os.environ["DDPJOB_HOME"])


def plan_of(job: str) -> dict:
    return json.loads((home() / "runs" / job / "plan.json").read_text())


def nothing_left(job: str) -> None:
    assert job_containers(home()) == []
    assert job_networks(home()) == []
    assert network.exists("podman", network.network_name(job)) is False


def test_two_nodes_at_their_own_addresses_across_a_sweep(bridge_image, tmp_path):
    """2 nodes x 1 process, two sweep elements one after the other on the job's one network (the
    second reuses the addresses): SUCCEEDED, each rank at its planned address, node 0's the
    rendezvous address, NCCL/Gloo on eth0, no way out of the network, and nothing left after."""
    (tmp_path / "addresses.py").write_text(ADDRESSES)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: bridge\ncommand: [python, addresses.py, --tag, '{tag}']\nnodes: 2\nprocs_per_node: 1\n"
                    "sweep: {tag: [a, b]}\nlocal: {network: bridge}\n")
    job = submit(tmp_path, bridge_image, str(spec))
    plan = plan_of(job)
    subnet = ipaddress.ip_network(plan["network_create"][plan["network_create"].index("--subnet") + 1])
    assert subnet.subnet_of(ipaddress.ip_network(network.POOL)) and subnet.is_private
    assert plan["network_name"] == f"ddpjob-{job}"
    st = wait_end(job, tmp_path)
    assert st["state"] == "SUCCEEDED", st
    for el in plan["elements"]:
        planned = [n["argv"][n["argv"].index("--ip") + 1] for n in el["nodes"]]
        recs = [json.loads((Path(el["output_dir"]) / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert [r["own"] for r in recs] == planned  # each rank where the plan put its node
        assert planned[0] != planned[1] and all(ipaddress.ip_address(a) in subnet for a in planned)
        assert recs[0]["everyone"] == recs[1]["everyone"] == planned  # they met, each seeing the other's address
        for rec in recs:
            assert rec["MASTER_ADDR"] == planned[0] == plan["master_addr"] and rec["MASTER_PORT"] == str(st["port"])
            assert rec["GLOO_SOCKET_IFNAME"] == rec["NCCL_SOCKET_IFNAME"] == network.IFNAME
            assert rec["ifaces"] == ["eth0", "lo"]
            assert "00000000" not in rec["routes"]  # internal: no default route, nothing leaves this machine
            assert rec["names"] == [network.host_name(0), network.host_name(1)]  # each node knows the others' names
            assert rec["mapped"] == [network.host_name(0) + "-v4mapped", network.host_name(1) + "-v4mapped"]
            assert rec["resolved"] == [[a] for a in planned]  # a node's name is still its IPv4 address alone
        for node in (0, 1):  # so torch's store never warns that it cannot name a client
            assert "err=-3" not in (home() / "runs" / job / f"task-{el['index']}" / f"node-{node}.log").read_text()
    plan_txt = (home() / "runs" / job / "plan.txt").read_text()
    assert f"rendezvous {plan['master_addr']}:{st['port']}" in plan_txt
    assert " ".join(plan["network_create"]) in plan_txt
    nothing_left(job)


def test_a_failing_rank_leaves_no_container_and_no_network(bridge_image, tmp_path):
    (tmp_path / "failer.py").write_text(FAILER)
    job = submit(tmp_path, bridge_image, "--nodes", "2", "--set", "local.network=bridge", "--", "python", "failer.py")
    st = wait_end(job, tmp_path)
    assert st["state"] == "FAILED" and "rank 1" in st["message"] and "boom" in st["message"], st
    nothing_left(job)
    wait_for(lambda: job_processes(job) == [], "no process of the job", timeout=30, poll=0.3)


def test_cancel_after_the_supervisor_was_killed_removes_the_network(bridge_image, tmp_path):
    """The supervisor (which removes the network at the job's end) is gone: cancel removes the
    containers and then the network."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    job = submit(tmp_path, bridge_image, "--nodes", "2", "--set", "local.network=bridge", "--", "python", "sleeper.py")
    out_dir = home() / "runs" / job / "output"
    wait_for(lambda: all((out_dir / f"started-{r}").exists() for r in (0, 1)), "both ranks to start", poll=0.3)
    assert job_networks(home()) == [f"ddpjob-{job}"]
    os.kill(status(job, tmp_path)["handle"]["pid"], signal.SIGKILL)
    proc = ddpjob("cancel", job, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert status(job, tmp_path)["state"] == "CANCELLED"
    nothing_left(job)
    assert job_processes(job) == []


def test_a_network_the_engine_refuses_is_a_refused_submit(bridge_image, tmp_path):
    """Another network took the job's subnet after the plan chose it (two submits racing): submit
    says why and starts nothing, and the other network is untouched."""
    ctx = PlanContext(job_id=f"race{os.getpid()}", run_dir=str(tmp_path / "run"), port=29500, cwd=str(tmp_path),
                      inputs=LocalInputs(os.getuid(), os.getgid(), tuple(network.used_subnets("podman"))))
    loaded = load_spec(None, base={"name": "race", "command": ["python", "x.py"], "image": bridge_image, "nodes": 2,
                                   "local": {"container": "podman", "network": "bridge"}})
    plan = LocalTarget().plan(loaded, ctx)
    create = plan.payload.network_create
    other = f"ddpjob-other{os.getpid()}"
    podman("network", "create", "--internal", "--subnet", create[create.index("--subnet") + 1], other)
    try:
        with pytest.raises(SubmitRejected, match="could not create the job's network"):
            LocalTarget().submit(plan)
        assert network.exists("podman", f"ddpjob-{ctx.job_id}") is False
        assert network.exists("podman", other) is True
        assert procs.marked_pids("DDPJOB_JOB_ID", ctx.job_id) == []
        assert not (tmp_path / "run" / "supervisor.log").exists()
    finally:
        podman("network", "rm", other, check=False)
