"""How a node runner frees its job's allocation (``end_allocation``): the line is in the node's log
before scancel runs, and only a scancel that fails by itself is reported as failed. The cancel signals
the step's processes, scancel among them (the runner's child under proctrack/linuxproc), so a scancel
ended by SIGTERM is the cancel arriving, not a failure (CI once read it as one: empty stderr).

A fake scancel on PATH stands in for Slurm's here (a corner: the real cancel is proven in
test_slurm_recovery.py and test_slurm_apart.py on the private cluster)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from launcher.targets.slurm.job.recover import end_allocation


def _scancel(bin_dir: Path, body: str) -> None:
    path = bin_dir / "scancel"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def node(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "1018")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    return bin_dir, tmp_path / "node-1.log"


def test_a_scancel_ended_by_the_cancels_own_signal_is_not_a_failure(node):
    bin_dir, log = node
    _scancel(bin_dir, f'echo "$1" > {bin_dir}/called; kill -TERM $$')
    end_allocation(str(log), "the run has ended and its batch host (node 0) is lost")
    assert (bin_dir / "called").read_text().strip() == "1018"
    assert log.read_text() == ("[ddpjob] the run has ended and its batch host (node 0) is lost: "
                               "cancelling Slurm job 1018 to free its allocation\n")


def test_a_scancel_that_fails_by_itself_is_said_with_its_reason_or_code(node):
    bin_dir, log = node
    _scancel(bin_dir, 'echo "scancel: error: Invalid job id specified" >&2; exit 1')
    end_allocation(str(log))
    assert log.read_text().splitlines() == [
        "[ddpjob] stall.action fail: cancelling Slurm job 1018 to free its allocation",
        "[ddpjob] scancel 1018 failed: scancel: error: Invalid job id specified; ddpjob cancel frees the allocation"]
    _scancel(bin_dir, "exit 3")  # nothing on stderr: the code is what there is to say
    end_allocation(str(log))
    assert log.read_text().splitlines()[-1] == "[ddpjob] scancel 1018 failed: exit code 3; ddpjob cancel frees the allocation"


def test_an_array_task_cancels_its_own_task_and_a_node_without_scancel_says_so(node, monkeypatch):
    bin_dir, log = node
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    _scancel(bin_dir, f'echo "$1" > {bin_dir}/called')
    end_allocation(str(log))
    assert (bin_dir / "called").read_text().strip() == "77_3"
    (bin_dir / "scancel").unlink()
    monkeypatch.setenv("PATH", str(bin_dir))
    end_allocation(str(log))
    assert log.read_text().splitlines()[-1] == \
        "[ddpjob] stall.action fail: no scancel on this node: ddpjob cancel frees the allocation"
