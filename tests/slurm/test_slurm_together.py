"""Several slurmd on one host (Slurm's multiple-slurmd setup; ``slurm/cluster.sh up --together``): the
node names resolve to loopback addresses of this one machine, where the first node runs too, so a
2-node job meets there. The session's cluster runs apart wherever it can, so this module starts a
second, throwaway cluster in the together layout (own root and ports, accounting off: no MariaDB or
slurmdbd), unless the session's cluster is together already.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SlurmCluster
from test_slurm_target import RECORD, records, submit, wait_for, write_spec

pytestmark = [pytest.mark.slurm, pytest.mark.real]


@pytest.fixture(scope="module")
def together_cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    if slurm_cluster.not_apart:
        yield slurm_cluster
        return
    parent = Path(tempfile.mkdtemp(prefix="ddpjob-slurm-together-", dir="/tmp"))
    parent.chmod(0o755)  # munged (user munge) must reach the root
    root = parent / "root"
    env = {"DDPJOB_SLURM_ROOT": str(root), "SLURM_TEST_PORT": os.environ.get("DDPJOB_SLURM_TEST_PORT3", "19717")}
    try:
        slurm_cluster.script("up", "--together", "--no-accounting", env=env, timeout=300)
        yield SlurmCluster(root=root, env=slurm_cluster.client_env(env), accounting=False, not_apart="together")
    finally:
        slurm_cluster.script("down", "--purge", env=env, timeout=120, check=False)
        if parent.exists():
            parent.rmdir()


def test_two_nodes_on_one_host_meet_over_its_loopback(together_cluster, cli, tmp_path, monkeypatch):
    """n2 resolves n1 to 127.0.77.1, a loopback address of this very machine where n1 runs: the job
    runs (it used to fail at once with "a loopback address, on this node")."""
    for key, value in together_cluster.env.items():
        monkeypatch.setenv(key, value)
    spec = write_spec(tmp_path, "together", ["python", RECORD, "--allreduce"])
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    recs = records(Path(data["handle"]["job_dir"]) / "output")
    assert [r["rank"] for r in recs] == [0, 1] and {r["allreduce_sum"] for r in recs} == {1.0}
    nodes = [json.loads(p.read_text()) for p in sorted((Path(data["handle"]["job_dir"]) / "task-0").glob("node-[0-9].json"))]
    assert [(n["host"], n["master_addr"]) for n in nodes] == [("n1", "127.0.77.1"), ("n2", "127.0.77.1")], nodes
    assert nodes[0]["machine"] and nodes[0]["machine"] == nodes[1]["machine"], nodes
