"""What the command line shows of a submitted job comes from the target's typed handle, not from
reading the stored JSON by key: native ids and where the logs live, per target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_the_registry_gives_back_the_shape_and_spec_summary_typed_and_shows_the_json_as_stored(ddpjob_home):
    """The shape recorded with the handle comes back a ``JobShape``, the stored spec is read through
    ``SpecSummary``; ``status -o json`` (``JobRecord.to_json``) shows the shape as it was stored."""
    from launcher.service.records import JobShape
    from launcher.service.shape import shape_of

    registry = Registry(ddpjob_home)
    spec = {"name": "t", "nodes": 2, "procs_per_node": "auto", "sweep": {"lr": [0.1, 0.2], "bs": [1, 2, 3]},
            "notify": {"command": ["true"]}, "output_dir": "/data/out", "image": "img:1"}
    job_id, _ = registry.reserve("t", "local", spec)
    old = registry.get(job_id)  # no shape recorded yet: read from the stored spec
    assert old.shape is None and old.to_json()["shape"] is None
    assert shape_of(old) == JobShape(runs=6, nodes=2, procs_per_node=None)
    summary = old.summary
    assert (summary.nodes, summary.procs_per_node, summary.notify, summary.output_dir, summary.image) == (
        2, "auto", True, "/data/out", "img:1")
    assert summary.sweep == {"lr": [0.1, 0.2], "bs": [1, 2, 3]}
    registry.record_handle(job_id, {"job_id": job_id, "run_dir": "/r"}, shape=JobShape(runs=6, nodes=2, procs_per_node=4))
    rec = registry.get(job_id)
    assert rec.shape == JobShape(runs=6, nodes=2, procs_per_node=4) and shape_of(rec) is rec.shape
    assert json.dumps(rec.to_json()["shape"]) == '{"nodes": 2, "procs_per_node": 4, "runs": 6}'


def test_a_node_row_is_typed_and_its_json_keeps_the_targets_keys_and_order():
    """``NodeStatus.of`` a target's row: typed node, log and exit code; ``status -o json`` shows the
    row as the target wrote it (key order too), the text and the dashboard its details in that order."""
    from launcher.targets.jobstatus import JobStatus, NodeStatus, TaskStatus

    row = {"node": 1, "host": "h1", "state": "exited", "exit_code": 3, "ended": 5.0, "error": None, "log": "/r/n1.log"}
    node = NodeStatus.of(row)
    assert (node.node, node.log, node.exit_code) == (1, "/r/n1.log", 3)
    assert node.details() == [("host", "h1"), ("state", "exited"), ("exit_code", 3)]
    pod = NodeStatus.of({"node": "odd-pod", "pod": "odd-pod", "phase": "Running", "restarts": 0})
    assert (pod.node, pod.log, pod.exit_code) == ("odd-pod", None, None)
    shown = JobStatus(JobState.FAILED, "x", [TaskStatus(0, JobState.FAILED, "", [node, pod])]).to_json()
    assert json.dumps(shown["tasks"][0]["nodes"]) == json.dumps([row, {"node": "odd-pod", "pod": "odd-pod",
                                                                         "phase": "Running", "restarts": 0}])
    # Its values are JSON to the leaf: a tuple a list, an object that is not JSON its text, keys text.
    odd = NodeStatus.of({"node": 2, "gpus": (0, 1), "where": Path("/r"), "seen": {3: [Path("/x")]}})
    assert odd.fields == {"node": 2, "gpus": [0, 1], "where": "/r", "seen": {"3": ["/x"]}}


def test_progress_is_typed_and_its_json_keeps_the_keys_and_order_users_script_against(tmp_path):
    """``read_progress`` gives a ``Progress``; ``-o json`` shows it as the dict it was before it was
    typed: the keys a metrics file gave, in a fixed order, ``task`` last for a sweep's run."""
    from launcher.core.progress import read_progress

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 10, "total_steps": 30, "loss": 2, "time": 100.0}) + "\n"
                    + json.dumps({"step": 20, "loss": 0.5, "samples_per_s": 90.5, "data_ms": 6, "compute_ms": 3.0,
                                  "comm_ms": 1.0, "peak_memory_mb": 512.0, "time": 110.0}) + "\n")
    progress = read_progress(str(path))
    assert progress is not None and (progress.step, progress.total_steps, progress.loss) == (20, 30, 0.5)
    assert json.dumps(progress.to_json()) == (
        '{"step": 20, "total_steps": 30, "loss": 0.5, "samples_per_s": 90.5, "data_ms": 6, "compute_ms": 3.0, '
        '"comm_ms": 1.0, "peak_memory_mb": 512.0, "updated": 110.0, "eta_s": 10.0}')
    assert list(progress.of_task(2).to_json())[-2:] == ["eta_s", "task"] and progress.of_task(2).to_json()["task"] == 2
    path.write_text(json.dumps({"step": 3}) + "\n")
    assert list(read_progress(str(path)).to_json()) == ["step", "updated"]


def test_the_service_holds_each_target_with_its_own_types_checked_at_run_time(ddpjob_home, tmp_path):
    """A target chosen by name reads a stored handle back as its own dataclass (no cast), refuses a
    plan made by another target, and says itself whether this machine can read its runs' metrics."""
    from launcher.service.results import metrics_elsewhere
    from launcher.spec.load import load_spec
    from launcher.targets.lookup import get_target

    registry = Registry(ddpjob_home)
    job_id, _ = registry.reserve("t-slurm", "slurm", {"name": "t-slurm", "nodes": 1})
    registry.record_handle(job_id, SlurmHandle(job_id, "/r", slurm_job_id="91", job_dir="/f").to_json())
    handle = Jobs(registry).bound(registry.get(job_id)).handle
    assert type(handle) is SlurmHandle and handle.native_ids() == ["91"] and handle.log_dir() == "/f"
    spec = tmp_path / "j.yaml"
    spec.write_text("name: j\ncommand: [python, t.py]\n")
    jobs = Jobs(registry)
    local_plan = jobs.plan(load_spec(str(spec)), "local")
    with pytest.raises(TypeError, match="a plan for the local target handed to the k8s target"):
        get_target("k8s").server_dry_run(local_plan)
    assert metrics_elsewhere("local") is None and metrics_elsewhere("gone") is None
    assert "inside their pods" in (metrics_elsewhere("k8s") or "")


def test_what_only_some_targets_do_is_a_protocol_a_target_has_by_defining_its_method(ddpjob_home, tmp_path):
    """``Target`` holds what every target does; picking the port, a dry run on the scheduler, cancelling
    one run and reading stacks are capabilities (``launcher.targets.capabilities``): each built-in target
    has those it defines, and a call of one it lacks says which targets have it (nothing is planned)."""
    from launcher.core.errors import UsageError
    from launcher.spec.load import load_spec
    from launcher.targets.base import Target
    from launcher.targets.capabilities import CancelsTasks, DryRunsOnServer, PicksPorts, ReadsStacks, which
    from launcher.targets.lookup import get_target

    assert not {"pick_port", "server_dry_run", "cancel_task", "stacks", "picks_port"} & set(dir(Target))
    assert which(PicksPorts) == ["local"] and which(DryRunsOnServer) == ["k8s"] and which(CancelsTasks) == ["slurm"]
    assert which(ReadsStacks) == ["local", "slurm", "k8s"]
    assert get_target("local").picks_port and not get_target("slurm").picks_port
    spec = tmp_path / "j.yaml"
    spec.write_text("name: j\ncommand: [python, t.py]\n")
    plan = Jobs(Registry(ddpjob_home)).plan(load_spec(str(spec)), "slurm")
    with pytest.raises(UsageError, match=r"^--dry-run=server is not supported by the slurm target \(the k8s target "
                                         r"can\); use --dry-run$"):
        get_target("slurm").server_dry_run(plan)
    with pytest.raises(UsageError, match=r"picking the rendezvous port is not supported by the k8s target \(the "
                                         r"local target can\); set master_port"):
        get_target("k8s").pick_port(set())


def test_mypy_refuses_an_explicit_any_where_what_comes_back_is_typed():
    """CI's mypy (strict) refuses ``Any`` written out in the target interface, the service, the
    command line and the dashboard: the override in pyproject.toml names them."""
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    blocks = [b.split("\n[", 1)[0] for b in text.split("[[tool.mypy.overrides]]")[1:]]
    strict = [b for b in blocks if "disallow_any_explicit = true" in b]
    assert len(strict) == 1, blocks
    for module in ("launcher.targets.base", "launcher.targets.chosen", "launcher.service.*", "launcher.cli.*",
                   "launcher.ui.*"):
        assert f'"{module}"' in strict[0], module
