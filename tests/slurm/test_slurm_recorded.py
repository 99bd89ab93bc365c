"""Issue 36 item 3: a Slurm job that has ended, looked at from a shell without the cluster's
``SLURM_CONF`` (the controller cannot be asked): the dashboard and ``status`` show what ddpjob
recorded (final state, nodes, kept logs), not "No node has started yet" and a red "controller
unreachable"."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from tests.ui.conftest import Dashboard, dashboard  # noqa: F401 - the dashboard fixture, as tests/ui start it
from tests.ui.test_ui_dashboard import request

pytestmark = [pytest.mark.slurm, pytest.mark.real]


@pytest.fixture
def without_slurm_conf(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SLURM_CONF in this test's environment, so neither does the dashboard started after it."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    yield


def test_a_finished_job_shows_its_record_without_the_controller(slurm_cluster, cli, tmp_path, without_slurm_conf,
                                                                 dashboard: Dashboard):  # noqa: F811
    (tmp_path / "hi.py").write_text("import os\nprint('hello from rank', os.environ['RANK'], flush=True)\n")
    spec = tmp_path / "hi.yaml"
    spec.write_text(yaml.safe_dump({"name": "hi", "workdir": str(tmp_path), "command": ["python", "hi.py"],
                                    "nodes": 2, "slurm": {"folder": str(tmp_path / "slurm"), "time": "5"}}))
    job = cli("submit", str(spec), "-t", "slurm", "-q", env=slurm_cluster.env, timeout=180, check=True).stdout.strip()
    assert cli("wait", job, "--timeout", "240", env=slurm_cluster.env, timeout=260).returncode == 0

    code, _, page = request(dashboard, "GET", f"/jobs/{job}")
    assert code == 200 and "SUCCEEDED" in page, page
    assert "No node has started yet" not in page and 'class="cause"' not in page, page  # no red box
    assert "host=n1" in page and "host=n2" in page and "hello from rank 1" in page, page
    assert "From ddpjob&#x27;s record and the job folder; Slurm controller" in page, page  # why Slurm was not asked

    shown = cli("status", job, "-o", "json", timeout=60)  # no SLURM_CONF: Slurm cannot be asked
    assert shown.returncode == 0, shown.stderr
    st = json.loads(shown.stdout)["status"]
    assert st["state"] == "SUCCEEDED" and st["details"]["source"].startswith("ddpjob's record and the job folder; Slurm")
    assert [n["host"] for n in st["tasks"][0]["nodes"]] == ["n1", "n2"]
