"""Secrets on the real Slurm cluster (slurm/cluster.sh): a job gets a masked ``env`` value and an
``env_from_host`` value (exported by sbatch from the submitting shell), ddpjob writes the host's
value nowhere (job folder, pickle, scripts, registry, plans), and the job folder is private."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slurm, pytest.mark.real]

REPORT = '''
import hashlib, json, os
digest = lambda k: hashlib.sha256(os.environ.get(k, "<unset>").encode()).hexdigest()
with open(os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "seen.json"), "w") as f:
    json.dump({k: digest(k) for k in ("API_TOKEN", "HOST_SECRET")}, f)
'''


@pytest.fixture(autouse=True)
def _slurm_env(slurm_cluster, monkeypatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)


def test_slurm_job_gets_its_secrets_and_ddpjob_stores_no_host_value(slurm_cluster, cli, tmp_path, ddpjob_home):
    token, host_value = f"tok-{secrets.token_hex(8)}", f"host-{secrets.token_hex(8)}"
    (tmp_path / "report.py").write_text(REPORT)
    folder = tmp_path / "slurm"
    spec = tmp_path / "sec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "sec", "workdir": str(tmp_path), "command": ["python", "report.py"], "nodes": 1,
        "env": {"API_TOKEN": token}, "env_from_host": ["HOST_SECRET"], "slurm": {"folder": str(folder), "time": "5"},
    }))
    proc = cli("submit", str(spec), "--target", "slurm", "-f", env={"HOST_SECRET": host_value}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.split()[1]
    data = json.loads(cli("status", job_id, "-o", "json").stdout)
    job_dir = Path(data["handle"]["job_dir"])
    seen = json.loads((job_dir / "output" / "seen.json").read_text())
    assert seen == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in
                    (("API_TOKEN", token), ("HOST_SECRET", host_value))}
    assert token not in json.dumps(data) and "API_TOKEN='***'" in (Path(data["run_dir"]) / "plan.txt").read_text()
    # plan.json is a record (the job runs from submitit's pickle): no secret value in it either.
    plan_json = (Path(data["run_dir"]) / "plan.json").read_text()
    assert token not in plan_json and '"API_TOKEN": "***"' in plan_json, plan_json
    for root in (folder, ddpjob_home):
        assert stat.S_IMODE(root.stat().st_mode) & 0o077 == 0, root
        for d, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(d) / name
                if path.is_symlink():  # submitit's links to the submission file: a link has no mode of its own
                    continue
                assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, path
                if path.is_file():
                    assert host_value.encode() not in path.read_bytes(), path
