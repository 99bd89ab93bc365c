"""What the command line shows of a submitted job comes from the target's typed handle, not from
reading the stored JSON by key: native ids and where the logs live, per target."""

from __future__ import annotations

import json

from launcher.core.states import JobState
from launcher.service.jobs import Jobs
from launcher.service.registry import Registry
from launcher.targets.k8s.target import K8sHandle, K8sRun
from launcher.targets.local.target import LocalHandle
from launcher.targets.slurm.target import SlurmHandle


def test_each_handle_says_its_native_ids_and_log_folder():
    assert LocalHandle("j", "/r", pid=1).native_ids() == [] and LocalHandle("j", "/r").log_dir() is None
    slurm = SlurmHandle("j", "/r", slurm_job_id="4242", array=True, job_dir="/shared/j")
    assert slurm.native_ids() == ["4242"] and slurm.log_dir() == "/shared/j"
    assert SlurmHandle("j", "/r").native_ids() == [] and SlurmHandle("j", "/r").log_dir() is None
    k8s = K8sHandle("j", "/r", jobs=[K8sRun(0, "j-0"), K8sRun(1, "j-1")])
    assert k8s.native_ids() == ["j-0", "j-1"] and k8s.log_dir() is None


def test_list_json_takes_native_ids_from_the_targets_handle(ddpjob_home, cli):
    """A recorded Slurm job and a Kubernetes one, both ended (no scheduler is asked): ``list -o json``
    shows each one's native ids as its handle states them."""
    registry = Registry(ddpjob_home)
    for target, handle in (("slurm", SlurmHandle("", "", slurm_job_id="77", job_dir="/f")),
                           ("k8s", K8sHandle("", "", jobs=[K8sRun(0, "named-0")]))):
        job_id, _ = registry.reserve(f"t-{target}", target, {"name": f"t-{target}", "nodes": 1})
        handle.job_id, handle.run_dir = job_id, str(registry.runs_dir() / job_id)
        registry.record_handle(job_id, handle.to_json())
        registry.update_state(job_id, JobState.SUCCEEDED, "done")
    listed = {r["target"]: r["native_ids"] for r in json.loads(cli("list", "-o", "json", check=True).stdout)}
    assert listed == {"slurm": ["77"], "k8s": ["named-0"]}
    assert [Jobs(registry).native_ids(r) for r in registry.list()] in (
        [["named-0"], ["77"]], [["77"], ["named-0"]])


def test_list_json_survives_a_record_whose_handle_cannot_be_read(ddpjob_home, cli):
    """A record from another installation (an unknown target, a handle of another shape) lists with
    no native ids instead of failing the whole listing."""
    registry = Registry(ddpjob_home)
    job_id, _ = registry.reserve("t-old", "gone", {"name": "t-old", "nodes": 1})
    registry.record_handle(job_id, {"job_id": job_id, "run_dir": "/nowhere"})
    registry.update_state(job_id, JobState.SUCCEEDED, "done")
    proc = cli("list", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["native_ids"] == []
