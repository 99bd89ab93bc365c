"""A first node whose name resolves to a loopback address on another node (NodeRunner._network):
no error where the first node runs on this very machine (same boot id and network namespace, from
its record), the error where it runs elsewhere or never says. The real 2-node run in that layout:
tests/slurm/test_slurm_together.py."""

from __future__ import annotations

import os

from launcher.targets.shared.files import write_json
from launcher.targets.slurm.job import node as node_mod
from launcher.targets.slurm.payload import SlurmCommon, SlurmElement, node_paths


def _runner(tmp_path):
    common = SlurmCommon(job_id="j", job_dir=str(tmp_path), nodes=2, procs_per_node=1, python="python3",
                         submit_python="python3", workdir=str(tmp_path), max_restarts=0, master_port=None,
                         requeue=False, signal_delay_s=15, max_timeouts=0, env={})
    return node_mod.NodeRunner(common, SlurmElement(0, {}, str(tmp_path / "out"), {}, ["true"]))


def _network(runner, first_machine, monkeypatch):
    monkeypatch.setattr(node_mod, "FIRST_NODE_WAIT_S", 0.2)  # a first node that never says: given up on sooner
    os.makedirs(f"{runner.common.job_dir}/task-0", exist_ok=True)
    if first_machine is not None:
        write_json(node_paths(runner.common.job_dir, 0, 0)["record"],
                   {"node": 0, "slurm_job_id": "7", "restart": 0, "machine": first_machine})
    record = {"slurm_job_id": "7", "restart": 0, "machine": node_mod.machine_id()}
    return runner._network("1", "n2", "127.0.0.1", 29500, {}, record)


def test_a_first_node_on_this_machine_is_reached_over_loopback(tmp_path, monkeypatch):
    assert node_mod.machine_id()  # Linux says it here
    assert _network(_runner(tmp_path), node_mod.machine_id(), monkeypatch) == ("127.0.0.1", None)


def test_a_first_node_elsewhere_or_silent_is_the_error_it_was(tmp_path, monkeypatch):
    for first in ("another-boot-id/4026531833", None):
        addr, problem = _network(_runner(tmp_path / str(first is None)), first, monkeypatch)
        assert addr == "127.0.0.1" and problem is not None
        assert "resolves to 127.0.0.1, a loopback address, on this node, and the first node does not run on this " \
               "machine" in problem, problem
