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
