"""``local.network: bridge`` without an engine: the plan (goldens for podman and docker), the
subnet choice, and the specs refused. DDPJOB_UPDATE_GOLDEN=1 rewrites the golden files."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import pytest
from goldens import assert_golden
from test_container_render import CTX, issues_of, node_command, spec

from launcher.core.errors import TargetUnavailable
from launcher.spec.load import load_spec
from launcher.targets.local import network
from launcher.targets.local.target import LocalTarget

GOLDEN = Path(__file__).parent / "golden"


def bridge(engine: str = "podman", **extra: object) -> dict[str, object]:
    return spec(local={"container": engine, "network": "bridge"}, **extra)


@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_golden_bridge_plan(engine):
    """Each node's container at its own address on the job's network, whose creation the plan
    shows; node 0's address is the rendezvous; NCCL/Gloo on the container's interface."""
    plan = LocalTarget().plan(load_spec(None, base=bridge(engine)), CTX)
    text = plan.render()
    assert_golden(GOLDEN / f"local_{engine}_bridge.txt", text)
    payload = plan.payload
    name = "ddpjob-demo-abcde"
    subnet = network.pick_subnet("demo-abcde", [])
    assert payload.network_name == name
    assert payload.network_create == [engine, "network", "create", "--internal", "--subnet", subnet,
                                      "--label", "ddpjob.job=demo-abcde", name]
    assert "\n" + " ".join(payload.network_create) + "\n" in text
    assert f"rendezvous {payload.master_addr}:29501" in text
    for el in payload.elements:
        addresses = []
        for n in el.nodes:
            argv = n.argv
            block = text.split(f"## task {el.index}")[1].split("\n\n## task")[0]
            assert node_command(block, n.node) == argv  # render == what runs
            assert argv[argv.index("--network") + 1] == name and "--network=host" not in argv
            addresses.append(argv[argv.index("--ip") + 1])
            torchrun = argv[argv.index("torch.distributed.run") :]
            assert torchrun[torchrun.index("--master-addr") + 1] == payload.master_addr
            assert n.env["NCCL_SOCKET_IFNAME"] == n.env["GLOO_SOCKET_IFNAME"] == "eth0"
            assert "--ipc=host" in argv
        assert addresses == [network.node_address(subnet, 0), network.node_address(subnet, 1)]
        assert addresses[0] == payload.master_addr and addresses[0] != addresses[1]
        assert all(ipaddress.ip_address(a) in ipaddress.ip_network(subnet) for a in addresses)


def test_host_is_the_default_and_unchanged():
    default = LocalTarget().plan(load_spec(None, base=spec()), CTX)
    host = LocalTarget().plan(load_spec(None, base=spec(local={"container": "podman", "network": "host"})), CTX)
    assert default.render() == host.render() and default.payload.network_name is None
    assert not default.payload.network_create and default.payload.master_addr == "127.0.0.1"


def test_the_spec_names_the_interface():
    plan = LocalTarget().plan(load_spec(None, base=bridge(nccl={"socket_ifname": "eth1"})), CTX)
    env = plan.payload.elements[0].nodes[0].env
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth1"


def test_subnet_avoids_what_this_machine_uses():
    inputs = dataclasses.replace(CTX.inputs, used_subnets=(network.pick_subnet("demo-abcde", []), "10.0.0.0/9"))
    plan = LocalTarget().plan(load_spec(None, base=bridge()), dataclasses.replace(CTX, inputs=inputs))
    create = plan.payload.network_create
    chosen = ipaddress.ip_network(create[create.index("--subnet") + 1])
    assert not any(chosen.overlaps(ipaddress.ip_network(u)) for u in inputs.used_subnets)
    full = dataclasses.replace(CTX, inputs=dataclasses.replace(CTX.inputs, used_subnets=(network.POOL,)))
    with pytest.raises(TargetUnavailable, match="no free subnet"):
        LocalTarget().plan(load_spec(None, base=bridge()), full)


@pytest.mark.parametrize("used,expect", [
    ([], None),  # the start derived from the id
    (["10.213.0.0/17"], lambda s: s.network_address >= ipaddress.ip_address("10.213.128.0")),
    (["10.213.0.0/16"], "none"),
    (["0.0.0.0/0"], "none"),  # a default route given by mistake would cover all: host_routes leaves it out
    (["not a subnet", "fd00::/8", "10.213.0.0/16"], "none"),
    (["not a subnet", "fd00::/8"], None),
])
def test_pick_subnet(used, expect):
    got = network.pick_subnet("demo-abcde", used)
    if expect == "none":
        assert got is None
        return
    assert got is not None
    net = ipaddress.ip_network(got)
    assert net.prefixlen == 24 and net.subnet_of(ipaddress.ip_network(network.POOL)) and net.is_private
    assert got == network.pick_subnet("demo-abcde", used)  # deterministic for one id
    if expect is not None:
        assert expect(net)


def test_jobs_start_their_search_apart():
    assert len({network.pick_subnet(f"demo-{i:05d}", []) for i in range(50)}) > 40


def test_host_routes_reads_the_kernel_table(tmp_path):
    table = tmp_path / "route"
    table.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "br0\t004D750A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "bad line\n")
    assert network.host_routes(str(table)) == ["10.117.77.0/24", "192.0.2.0/24"]  # no default route
    assert network.host_routes(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("change,field,words", [
    ({"local": {"network": "bridge"}}, ("local", "network"), "local.container is none"),
    ({"local": {"container": "podman", "network": "bridge"}, "nodes": 254}, ("nodes",), "at most 253 nodes"),
])
def test_refused_in_plan(change, field, words):
    issues = issues_of(spec(**change))
    assert any(path == field and words in msg for path, msg in issues), issues


def test_cli_refuses_bridge_without_a_container(cli, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\ncommand: [python, train.py]\nlocal:\n  network: bridge\n")
    (tmp_path / "train.py").write_text("")
    for verb in (["submit"], ["render"]):
        proc = cli(*verb, str(spec_file), "--target", "local", cwd=tmp_path)
        assert proc.returncode == 2 and f"{spec_file}:4" in proc.stderr and "local.network" in proc.stderr, proc.stderr
        assert "local.container: podman" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("submit", str(spec_file), "--target", "local", "--set", "local.network=nat", cwd=tmp_path)
    assert proc.returncode == 2 and "local.network" in proc.stderr, proc.stderr
    assert cli("list", "-o", "json").stdout.strip() in ("", "[]")  # nothing was submitted


def test_cli_renders_docker_bridge_without_docker(cli, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\nimage: localhost/x\ncommand: [python, -m, launcher.train]\nnodes: 2\n"
                         "local: {container: docker, network: bridge}\n")
    proc = cli("render", str(spec_file), "--target", "local", cwd=tmp_path, env={"PATH": str(tmp_path / "none")})
    assert proc.returncode == 0, proc.stderr
    assert "docker network create --internal --subnet 10.213." in proc.stdout
    assert "--network ddpjob-demo-xxxxx --ip 10.213." in proc.stdout
