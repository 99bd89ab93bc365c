"""An ended job whose Slurm allocation is still alive: ``ddpjob cancel`` asks the scheduler, whatever
ddpjob last recorded, and frees it (it used to answer "already ended" and leave it to scancel)."""

from __future__ import annotations

import pytest
from test_slurm_target import RECORD, _slurm_env, submit, wait_for, write_spec  # noqa: F401 - the autouse fixture
from testkit import wait_for as wait_for_value
from testkit import wait_for_no_job_processes

pytestmark = [pytest.mark.slurm, pytest.mark.real]


def test_cancel_frees_an_allocation_that_ddpjob_recorded_as_ended(slurm_cluster, cli, tmp_path, ddpjob_home):
    from launcher.core.states import JobState
    from launcher.service.registry import Registry

    spec = write_spec(tmp_path, "held", ["python", RECORD, "--sleep", "300"])
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"RUNNING"}, timeout=120)
    jid = data["handle"]["slurm_job_id"]
    # The corner: ddpjob recorded the job as ended while Slurm still runs it (as a stall watch's
    # FAILED used to be, while Slurm waited on a node it could not reach).
    Registry(ddpjob_home).update_state(job_id, JobState.FAILED, "ended by hand for this test")
    proc = cli("cancel", job_id, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "still held its allocation: cancelled it there" in proc.stdout, proc.stdout

    def squeue() -> list[str]:
        return slurm_cluster.run("squeue", "-h", "-j", jid, "-o", "%T", check=False).stdout.split()

    wait_for_value(lambda: not squeue(), "squeue to list the job no more", timeout=30)
    again = cli("cancel", job_id, timeout=60)
    assert again.returncode == 0 and "already ended: FAILED" in again.stdout, again.stdout
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel")
