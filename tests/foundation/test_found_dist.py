"""Rendezvous and NCCL/Gloo environment per target: table tests of the pure functions."""

from __future__ import annotations

import pytest

from launcher.spec.load import load_spec
from launcher.targets.k8s import target as k8s
from launcher.targets.local import target as local
from launcher.targets.shared import dist
from launcher.targets.slurm import target as slurm
from launcher.targets.slurm.job import node as slurm_node

DEFAULTS = {"local": local.NCCL_DEFAULTS, "slurm": slurm.NCCL_DEFAULTS, "k8s": k8s.NCCL_DEFAULTS}


def spec(**fields):
    return load_spec(None, base={"name": "t", "command": ["python", "t.py"], **fields}).spec


@pytest.mark.parametrize("target,expected", [
    ("local", {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}),
    ("slurm", {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"}),
    ("k8s", {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}),
])
def test_target_defaults(target, expected):
    assert dist.nccl_env(spec(), DEFAULTS[target]) == expected


@pytest.mark.parametrize("nccl,env,target,key,value", [
    ({"debug": "INFO"}, {}, "local", "NCCL_DEBUG", "INFO"),
    ({"ib_disable": False}, {}, "local", "NCCL_IB_DISABLE", "0"),
    ({"ib_disable": True}, {}, "slurm", "NCCL_IB_DISABLE", "1"),
    ({"socket_ifname": "eth1"}, {}, "k8s", "GLOO_SOCKET_IFNAME", "eth1"),
    ({"extra": {"NCCL_P2P_DISABLE": "1"}}, {}, "slurm", "NCCL_P2P_DISABLE", "1"),
    ({"debug": "INFO"}, {"NCCL_DEBUG": "TRACE"}, "local", "NCCL_DEBUG", "TRACE"),  # env: wins over nccl:
    ({}, {"OMP_NUM_THREADS": "7"}, "local", "OMP_NUM_THREADS", "7"),  # user values always win
    ({}, {"NCCL_SOCKET_IFNAME": "ib0"}, "k8s", "NCCL_SOCKET_IFNAME", "ib0"),
])
def test_user_values_win(nccl, env, target, key, value):
    out = dist.process_env(spec(nccl=nccl, env=env), DEFAULTS[target], cpus_per_node=4, procs_per_node=2)
    assert out[key] == value


def test_rdma_enables_ib_on_k8s():
    assert dist.nccl_env(spec(), k8s.NCCL_DEFAULTS_RDMA)["NCCL_IB_DISABLE"] == "0"
    assert dist.nccl_env(spec(), k8s.NCCL_DEFAULTS_RDMA) == {**k8s.NCCL_DEFAULTS, "NCCL_IB_DISABLE": "0"}


@pytest.mark.parametrize("cpus,procs,threads", [(None, 2, 1), (8, 2, 4), (2, 4, 1), (1, 1, 1), (16, 1, 16)])
def test_omp_threads_split_cores(cpus, procs, threads):
    assert dist.omp_threads(cpus, procs) == threads


def test_never_sets_what_torchrun_computes():
    out = dist.process_env(spec(), local.NCCL_DEFAULTS, cpus_per_node=2, procs_per_node=1)
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"} & set(out)


@pytest.mark.parametrize("ppn,gpus,expected", [("auto", 0, 1), ("auto", 4, 4), (3, 0, 3), (2, 8, 2)])
def test_procs_per_node(ppn, gpus, expected):
    assert dist.resolve_procs_per_node(spec(procs_per_node=ppn), gpus) == expected


def test_slurm_ports():
    ports = {slurm_node.slurm_port(j) for j in range(1000, 1100)}
    assert len(ports) == 100 and all(20000 <= p < 30000 for p in ports)
    assert slurm_node.slurm_port(1234) == slurm_node.slurm_port("1234")  # deterministic
    elements = {slurm_node.slurm_port(77, i) for i in range(10)}
    assert len(elements) == 10 and slurm_node.slurm_port(77) not in elements
