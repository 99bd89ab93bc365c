"""A user's week (issue 25) on Slurm: rerun, the queue view and Ctrl-C words, on the project's real
private cluster (slurm/cluster.sh; fixture slurm_cluster), through the real command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.real]

REPO = Path(__file__).resolve().parents[2]
PRINT_SEED = "[python, -c, 'import os; print(\"seed=\" + os.environ[\"SEED\"], flush=True)']"


@pytest.fixture(autouse=True)
def _slurm_env(slurm_cluster, monkeypatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


def write_spec(tmp_path: Path, name: str = "week", **extra: Any) -> Path:
    import yaml

    spec = {"name": name, "workdir": str(REPO), "command": ["python", "-c", "print('hi')"], "nodes": 1,
            "procs_per_node": 1, "env": {"SEED": "1"},
            "slurm": {"folder": str(tmp_path / "slurm"), "time": "10", "signal_delay_s": 15}}
    spec.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_rerun_on_slurm_with_overrides(cli, tmp_path):
    spec = write_spec(tmp_path, env={"SEED": "1", "DB_PASSWORD": "pw-from-file"})
    first = cli("submit", "-q", str(spec), "--target", "slurm", "--set", f"command={PRINT_SEED}", check=True,
                timeout=180).stdout.strip()
    assert cli("wait", first, "--timeout", "240", timeout=300).returncode == 0
    proc = cli("rerun", first, "--set", "env.SEED=2", "--nodes", "2", "-f", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[node0 rank0] seed=2" in proc.stdout and "[node1 rank1] seed=2" in proc.stdout, proc.stdout
    listed = json.loads(cli("list", "-o", "json", check=True, timeout=120).stdout)
    assert listed[0]["rerun_of"] == first and listed[0]["target"] == "slurm" and listed[0]["nodes"] == 2
    assert "pw-from-file" not in cli("status", listed[0]["id"], "-o", "json", check=True, timeout=120).stdout
