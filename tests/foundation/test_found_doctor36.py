"""Issue 36 item 2: the doctor's hint about the link's speed fits what the user did (named the
interface or not), and ``doctor --set`` lets them follow it on the command line."""

from __future__ import annotations

import json

import pytest


def _report(env: dict[str, str], link: dict | None) -> dict:
    ranks = [{"rank": i, "host": f"h{i}", "address": f"10.0.0.{i + 1}", "env": env,
              **({"link": link} if link is not None else {})} for i in range(2)]
    results = [{"bytes": 2**20, "iters": 3, "time_us": 10.0, "algbw_gbps": 0.5, "busbw_gbps": 0.5}]
    return {"world_size": 2, "ranks": ranks, "results": results}


def test_the_link_hint_follows_what_the_user_set():
    from launcher.doctor.run import bandwidth_verdict, verdict

    unnamed = bandwidth_verdict(_report({}, {"interface": "br0", "mbits": None}))
    assert unnamed.startswith("not judged: best busbw 0.50 GB/s") and "--set nccl.socket_ifname=IFACE" in unnamed
    named = bandwidth_verdict(_report({"NCCL_SOCKET_IFNAME": "veth7"}, {"interface": "veth7", "mbits": None}))
    assert "--set" not in named and "name it" not in named, named
    assert "interface veth7 (nccl.socket_ifname) reports no link speed" in named, named
    # The speed each node reads for its own link, not the submitting machine's /sys
    fast = _report({"NCCL_SOCKET_IFNAME": "eth9"}, {"interface": "eth9", "mbits": 100_000})
    assert bandwidth_verdict(fast) == "low: best busbw 0.50 GB/s against the 12.5 GB/s the network link should carry"
    assert any("under 10%" in w for w in verdict(fast))


def test_doctor_set_reaches_the_check_and_a_bad_field_is_refused(cli, tmp_path):
    refused = cli("doctor", "--set", "nccl.socket_ifnam=eth0", cwd=tmp_path)
    assert refused.returncode == 2 and "socket_ifnam" in refused.stderr and "--set" in refused.stderr, refused.stderr
    assert "No such option" not in refused.stderr and "Traceback" not in refused.stderr
    assert json.loads(cli("list", "-o", "json", cwd=tmp_path, check=True).stdout) == []  # nothing submitted


@pytest.mark.real
def test_doctor_set_names_the_interface_the_ranks_use(cli, tmp_path):
    proc = cli("doctor", "--nodes", "1", "-p", "2", "--max-mib", "1", "--iters", "1", "--set", "nccl.socket_ifname=lo",
               "-o", "json", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    ranks = json.loads(proc.stdout)["ranks"]
    assert [r["env"]["NCCL_SOCKET_IFNAME"] for r in ranks] == ["lo", "lo"]
    assert all(r["link"] == {"interface": "lo", "mbits": None} for r in ranks), ranks  # loopback has no speed
