"""A user's week (issue 25) on the local target: rerun, the queue view, Ctrl-C words, the pip user's
path. Real local jobs through the real command line in a subprocess."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SHOW_ENV = """\
import os
print("token-ok" if os.environ.get("API_TOKEN") == "from-the-file" else "token-wrong",
      "other-ok" if os.environ.get("OTHER_SECRET") == "given-on-the-line" else "other-wrong",
      "seed=" + os.environ.get("SEED", "-"), "rank=" + os.environ["RANK"], flush=True)
"""


def _spec(folder: Path) -> Path:
    (folder / "show_env.py").write_text(SHOW_ENV)
    spec = folder / "week.yaml"
    spec.write_text("name: week\ncommand: [python, show_env.py]\nnodes: 2\n"
                    "env: {API_TOKEN: from-the-file, SEED: '1'}\n")
    return spec


@pytest.mark.real
def test_rerun_submits_the_recorded_spec_again_with_secrets_from_their_sources(cli, tmp_path, ddpjob_home):
    project = tmp_path / "project"
    project.mkdir()
    spec = _spec(project)
    first = cli("submit", "-q", "week.yaml", "--set", "env.OTHER_SECRET=given-on-the-line", cwd=project, check=True)
    first_id = first.stdout.strip()
    assert cli("wait", first_id, "--timeout", "120").returncode == 0

    # From another folder, with an override: the job runs from where it was submitted (show_env.py
    # is relative), the file's secret is read again, the command line's must be given again.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused = cli("rerun", first_id, "--set", "env.SEED=2", cwd=elsewhere)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "env.OTHER_SECRET" in refused.stderr and f"ddpjob rerun {first_id} --set env.OTHER_SECRET=" in refused.stderr
    assert "env.API_TOKEN" not in refused.stderr and "given-on-the-line" not in refused.stderr
    assert len(json.loads(cli("list", "-o", "json", check=True).stdout)) == 1  # nothing submitted

    proc = cli("rerun", first_id, "--set", "env.SEED=2", "--set", "env.OTHER_SECRET=given-on-the-line", "-f",
               cwd=elsewhere, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[node1 rank1] token-ok other-ok seed=2 rank=1" in proc.stdout, proc.stdout
    assert f"Rerunning {first_id} with env.SEED=2, env.OTHER_SECRET=***" in proc.stdout
    listed = json.loads(cli("list", "-o", "json", check=True).stdout)
    second_id = listed[0]["id"]
    assert listed[0]["rerun_of"] == first_id and listed[1]["rerun_of"] is None
    data = json.loads(cli("status", second_id, "-o", "json", check=True).stdout)
    assert data["rerun_of"] == first_id and data["spec"]["env"]["SEED"] == "2"
    assert f"rerun of: {first_id}" in cli("status", second_id, check=True).stdout
    # A rerun of a rerun finds the file's secret again; the line's still has to be given.
    third = cli("rerun", second_id, "--set", "env.OTHER_SECRET=given-on-the-line", "--nodes", "1", "-q", "-f",
                cwd=elsewhere, timeout=180)
    assert third.returncode == 0 and "token-ok other-ok seed=2 rank=0" in third.stdout, third.stdout + third.stderr

    # No value of a secret is in the registry.
    with sqlite3.connect(ddpjob_home / "registry.db") as db:
        dump = "\n".join(db.iterdump())
    assert "from-the-file" not in dump and "given-on-the-line" not in dump

    # The file changed: its secret is gone, so the rerun says where it looked and how to give it.
    spec.write_text(spec.read_text().replace("API_TOKEN: from-the-file, ", ""))
    gone = cli("rerun", first_id, "--set", "env.OTHER_SECRET=x", cwd=elsewhere)
    assert gone.returncode == 2 and f"it came from {spec}, which no longer holds it" in gone.stderr, gone.stderr


def test_rerun_of_an_unknown_job_is_exit_4_and_help_has_an_example(cli):
    proc = cli("rerun", "nosuch-abcde")
    assert proc.returncode == 4 and "nosuch-abcde" in proc.stderr
    helped = cli("rerun", "--help", check=True).stdout
    assert "ddpjob rerun ID --set env.SEED=2" in helped and "rerun_of" in helped
