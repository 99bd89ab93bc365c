"""The interface check every node runs before torchrun (launcher.targets.shared.netif): NCCL's
forms of NCCL_SOCKET_IFNAME, Gloo's exact names, and the message a node without the interface gives."""

from __future__ import annotations

import pytest

from launcher.targets.shared import netif

NODE = {"lo": "127.0.0.1", "eth0": "10.1.2.3", "eth1": "", "docker0": "172.17.0.1"}


@pytest.mark.parametrize(("value", "chosen"), [
    ("eth", ["eth0", "eth1"]),          # prefixes
    ("=eth0", ["eth0"]),                # exact
    ("=eth", []),
    ("^docker,lo", ["eth0", "eth1"]),   # all but
    ("^=eth0", ["lo", "docker0", "eth1"]),
    ("nosuch0", []),
    ("eth0,docker", ["eth0", "docker0"]),
])
def test_nccl_forms_select_interfaces(value, chosen):
    assert sorted(netif.select(value, list(NODE))) == sorted(chosen)


@pytest.mark.parametrize(("value", "gloo"), [
    ("eth", ["eth0"]),            # eth1 has no address: Gloo could not bind it
    ("^docker", ["eth0"]),        # an exclusion leaves loopback out while a real interface remains
    ("^docker,eth", ["lo"]),      # ... unless loopback is all there is
    ("eth0", ["eth0"]),
])
def test_gloo_gets_exact_names_with_addresses(value, gloo):
    assert netif.gloo_names(value, NODE) == gloo


def test_a_missing_interface_names_node_request_and_what_it_has():
    updates, problem = netif.check({"NCCL_SOCKET_IFNAME": "nosuch0", "GLOO_SOCKET_IFNAME": "nosuch0"}, "node 1 (n2)", NODE)
    assert updates == {}
    assert problem is not None
    assert problem.startswith("node 1 (n2): NCCL_SOCKET_IFNAME=nosuch0 matches no interface")
    assert "it has: docker0 172.17.0.1, eth0 10.1.2.3, lo 127.0.0.1; without an IPv4 address: eth1." in problem


def test_nccl_form_is_rewritten_for_gloo_and_exact_names_are_kept():
    updates, problem = netif.check({"NCCL_SOCKET_IFNAME": "^lo,docker", "GLOO_SOCKET_IFNAME": "^lo,docker"}, "n", NODE)
    assert problem is None and updates == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert netif.check({"GLOO_SOCKET_IFNAME": "eth0"}, "n", NODE) == ({}, None)
    assert netif.check({}, "n", NODE) == ({}, None)  # nothing asked, nothing checked


def test_this_machine_has_loopback_and_a_route_to_itself():
    here = netif.interfaces()
    assert here.get("lo") == "127.0.0.1"
    master, own, iface = netif.route_to("127.0.0.1", 9)
    assert (master, own, iface) == ("127.0.0.1", "127.0.0.1", "lo")
    assert netif.is_loopback(own) and not netif.is_loopback("10.1.2.3") and not netif.is_loopback("n1")


def test_local_refuses_an_interface_this_machine_lacks_before_anything_starts(cli, tmp_path):
    """The local nodes are this machine: a socket_ifname it lacks is a spec error at submit (exit 2,
    file:line, its interfaces), not Gloo's "Unable to find address" from every rank."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: ifcheck\ncommand: [python, -c, 'print(1)']\nnodes: 2\nnccl: {socket_ifname: nosuch0}\n")
    proc = cli("submit", str(spec), "--target", "local", cwd=tmp_path, env={"DDPJOB_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{spec}:4:8: nccl.socket_ifname: this machine: NCCL_SOCKET_IFNAME=nosuch0 matches no interface" in proc.stderr
    assert "lo 127.0.0.1" in proc.stderr and "nothing was submitted" in proc.stderr
    assert cli("list", "-o", "json", env={"DDPJOB_HOME": str(tmp_path / "home")}).stdout.strip() == "[]"


def test_local_hands_gloo_the_exact_names_an_nccl_form_selects_here(cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: ifform\ncommand: [python, -c, 'print(1)']\nnodes: 2\nnccl: {socket_ifname: '=lo'}\n")
    proc = cli("render", str(spec), "--target", "local", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "NCCL_SOCKET_IFNAME==lo " in proc.stdout and "GLOO_SOCKET_IFNAME=lo " in proc.stdout, proc.stdout
