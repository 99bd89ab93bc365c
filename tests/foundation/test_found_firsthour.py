"""The first hour without a stumble (issue 45, item 7): messages that pointed the wrong way now say what to
write instead, and name what the user typed."""

from __future__ import annotations

from pathlib import Path

import pytest


def _spec(tmp_path: Path, body: str) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: first\n" + body)
    return spec


@pytest.mark.parametrize("body,words", [
    ("command: [python, t.py]\nresources: {memory: 2048}\n",
     ["resources.memory: Input should be a valid string (got 2048)", "hint: add a unit, e.g. memory: 2048Mi or 2Gi"]),
    ("command: [python, t.py]\nslurm: {memory: 16}\n", ["slurm.memory:", "hint: add a unit, e.g. memory: 16Mi"]),
    ("command: python train.py --lr 0.1\n",
     ["command: Input should be a valid list", "hint: write it as a list, one argument per item: command: "
      "[python, train.py, --lr, 0.1] (it is never run through a shell)"]),
    ("command: [python, t.py]\nenv: {RANK: '0'}\n", ["env.RANK: RANK is set for each process and cannot be set here: "
                                                    "torchrun sets it from nodes and procs_per_node\n"]),
    ("command: [python, t.py]\nenv: {PET_NNODES: '2'}\n", ["the training operator sets PET_* in a PyTorchJob's pods"]),
    ("command: [python, t.py]\nenv: {MASTER_PORT: '1'}\n", ["use master_port: to choose the rendezvous port"]),
    ("command: [python, t.py]\nenv: {DDPJOB_JOB_ID: x}\n", ["ddpjob sets it for each run"]),
])
def test_a_wrong_value_is_told_what_to_write(cli, tmp_path, body, words):
    proc = cli("validate", str(_spec(tmp_path, body)))
    assert proc.returncode == 2, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    assert "master_port" not in proc.stderr or "MASTER_PORT" in body  # no longer the hint for every name


def test_a_flag_is_named_as_typed_not_as_a_set_never_written(cli, tmp_path):
    proc = cli("render", str(_spec(tmp_path, "command: [python, t.py]\n")), "--nodes", "-1", "-p", "0", "--name", "X")
    assert proc.returncode == 2
    assert "--nodes -1: nodes: Input should be greater than or equal to 1" in proc.stderr, proc.stderr
    assert "--procs-per-node 0: procs_per_node:" in proc.stderr and "--name X: name:" in proc.stderr
    assert "--set" not in proc.stderr
    said = cli("render", str(_spec(tmp_path, "command: [python, t.py]\n")), "--set", "nodes=-1").stderr
    assert "--set nodes=-1: nodes:" in said  # a --set is still named as one


def test_validate_says_no_submit_and_a_missing_file_names_no_field(cli, tmp_path):
    missing = cli("validate", str(tmp_path / "nothere.yaml"))
    assert missing.returncode == 2
    assert f"{tmp_path / 'nothere.yaml'}: file not found" in missing.stderr and "<root>" not in missing.stderr
    assert missing.stderr.rstrip().endswith("1 problem found.") and "submitted" not in missing.stderr
    assert "nothing was submitted" in cli("submit", str(tmp_path / "nothere.yaml")).stderr


def test_list_says_when_its_limit_left_jobs_out(cli, ddpjob_home):
    """Issue 45, item 8: `list` stopped at 50 jobs without a word."""
    from launcher.service.registry import Registry

    reg = Registry(ddpjob_home)
    ids = [reg.reserve("many", "local", {"name": "many", "nodes": 1})[0] for _ in range(3)]
    cut = cli("list", "--limit", "2")
    assert cut.returncode == 0 and len(cut.stdout.splitlines()) == 3, cut.stdout  # header and 2 jobs
    assert "(the newest 2 jobs; there are more: --limit N shows N, --limit 0 all)" in cut.stderr
    for whole in (cli("list", "--limit", "3"), cli("list", "--limit", "0"), cli("list")):
        assert whole.returncode == 0 and "there are more" not in whole.stderr and all(i in whole.stdout for i in ids)


@pytest.mark.parametrize("target", ["local", "slurm"])
def test_a_server_dry_run_where_there_is_no_server_is_refused_before_any_plan(cli, target):
    """Issue 45, item 8: --dry-run=server on local printed the client dry run as if the server had checked it."""
    proc = cli("submit", "jobs/quickstart.yaml", "--dry-run=server", "--target", target)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert f"--dry-run=server asks a cluster's API server, and the {target} target has none" in proc.stderr


def test_slurms_folder_follows_ddpjob_home(cli, ddpjob_home, monkeypatch, tmp_path):
    """Issue 45, item 8: with DDPJOB_HOME set, Slurm's job folders stayed under ~/.ddpjob/slurm."""
    assert f"job dir {ddpjob_home}/slurm/quickstart-xxxxx" in cli("render", "jobs/quickstart.yaml", "-t", "slurm").stdout
    monkeypatch.delenv("DDPJOB_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))  # (nothing of the real home is touched)
    assert f"job dir {tmp_path}/.ddpjob/slurm/quickstart-xxxxx" in cli("render", "jobs/quickstart.yaml", "-t", "slurm").stdout


def test_status_without_an_id_lists_the_newest_jobs(cli, ddpjob_home):
    """Issue 45, item 9 (kubectl's and squeue's habit): `ddpjob status` alone was a usage error."""
    from launcher.service.registry import Registry

    empty = cli("status")
    assert empty.returncode == 0 and "no jobs yet" in empty.stdout, empty.stdout + empty.stderr
    job_id = Registry(ddpjob_home).reserve("one", "local", {"name": "one", "nodes": 1})[0]
    listed = cli("status")
    assert listed.returncode == 0 and listed.stdout.startswith("ID ") and job_id in listed.stdout
    assert "ddpjob status ID shows one job" in listed.stderr
    import json

    assert [j["id"] for j in json.loads(cli("status", "-o", "json").stdout)] == [job_id]
