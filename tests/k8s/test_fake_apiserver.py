"""The loopback API server with the real kubernetes client: Status objects, strictness, operator behaviour."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_apiserver import descendants, expand_refs
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from testkit import needs_crd, wait_for

from launcher.targets.shared.procs import alive, start_time

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"


def api(k8s_api):
    return client.CustomObjectsApi(config.new_client_from_config(str(k8s_api.kubeconfig)))


def core(k8s_api):
    return client.CoreV1Api(config.new_client_from_config(str(k8s_api.kubeconfig)))


def job(name: str, command: list[str], workers: int = 1, port: int = 29500, env=None) -> dict:
    c = {"name": "pytorch", "image": "local", "command": command, "env": env or [],
         "ports": [{"name": "pytorchjob-port", "containerPort": port}]}
    specs = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [copy.deepcopy(c)]}}}}
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "Never", "template": {"spec": {"containers": [copy.deepcopy(c)]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"nprocPerNode": "1", "runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs}}


def create(k8s_api, obj, **kw):
    return api(k8s_api).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, obj, field_validation="Strict", **kw)


def wait_state(k8s_api, name, want, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = k8s_api.server.job(name)
        conds = [c["type"] for c in (j or {}).get("status", {}).get("conditions", []) if c["status"] == "True"]
        if want in conds:
            return j
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {want}: {k8s_api.server.job(name)}")


def test_kubelet_expansion():
    env = {"A": "1", "B": "x y"}
    assert expand_refs("$(A)-$(B)", env) == "1-x y"
    assert expand_refs("$$(A) $(NOPE) $", env) == "$(A) $(NOPE) $"


@needs_crd
def test_status_errors_reach_the_real_client(k8s_api):
    obj = job("demo", ["true"], workers=0)
    bad = copy.deepcopy(obj)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolcy"] = "Never"
    with pytest.raises(ApiException) as e:
        create(k8s_api, bad)
    assert e.value.status == 422 and "restartPolcy" in json.loads(e.value.body)["message"]
    create(k8s_api, obj)
    with pytest.raises(ApiException) as e:
        create(k8s_api, obj)
    assert e.value.status == 409 and json.loads(e.value.body)["reason"] == "AlreadyExists"
    k8s_api.server.fail_next("POST", "pytorchjobs", 403)
    with pytest.raises(ApiException) as e:
        create(k8s_api, job("other", ["true"], workers=0))
    assert e.value.status == 403 and "forbidden" in json.loads(e.value.body)["message"]
    k8s_api.server.crd_installed = False
    with pytest.raises(ApiException) as e:
        create(k8s_api, job("third", ["true"], workers=0))
    assert e.value.status == 404
    k8s_api.server.crd_installed = True
    dry = create(k8s_api, job("dry", ["true"], workers=0), dry_run="All")
    assert dry["metadata"]["name"] == "dry" and k8s_api.server.job("dry") is None


PRINT_ENV = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k in %r}))" % (
    ["RANK", "WORLD_SIZE", "PET_NNODES", "PET_NODE_RANK", "MASTER_PORT", "PET_NPROC_PER_NODE", "USER_VAR", "EXPANDED"])


def test_operator_env_and_expansion(k8s_api):
    obj = job("envjob", [sys.executable, "-c", PRINT_ENV], workers=1, port=29555,
              env=[{"name": "USER_VAR", "value": "mine"}, {"name": "RANK", "value": "99"},
                   {"name": "EXPANDED", "value": "v-$(USER_VAR)"}])
    create(k8s_api, obj)
    wait_state(k8s_api, "envjob", "Succeeded")
    c = core(k8s_api)
    seen = {}
    for pod in ("envjob-master-0", "envjob-worker-0"):
        seen[pod] = json.loads(c.read_namespaced_pod_log(pod, "default", container="pytorch").strip().splitlines()[-1])
    assert seen["envjob-master-0"]["RANK"] == "0" and seen["envjob-worker-0"]["RANK"] == "1"  # operator wins over user
    assert seen["envjob-worker-0"]["PET_NNODES"] == "2" and seen["envjob-worker-0"]["WORLD_SIZE"] == "2"
    assert seen["envjob-master-0"]["EXPANDED"] == "v-mine"
    pods = {p.name: p for p in k8s_api.server.pods_of("envjob")}
    assert pods["envjob-worker-0"].injected_env["MASTER_ADDR"] == "envjob-master-0"
    assert pods["envjob-worker-0"].injected_env["MASTER_PORT"] == "29555"
    labels = c.list_namespaced_pod("default", label_selector="training.kubeflow.org/job-name=envjob").items
    assert sorted(p.metadata.labels["training.kubeflow.org/replica-type"] for p in labels) == ["master", "worker"]


DDP = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    print("sum", t.item(), "world", dist.get_world_size(), flush=True)
    dist.destroy_process_group()
""")


def test_torchrun_without_rendezvous_flags_runs_ddp(k8s_api, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    create(k8s_api, job("ddp", [sys.executable, "-m", "torch.distributed.run", str(script)], workers=1))
    wait_state(k8s_api, "ddp", "Succeeded", timeout=180)
    c = core(k8s_api)
    for pod in ("ddp-master-0", "ddp-worker-0"):
        assert "sum 3.0 world 2" in c.read_namespaced_pod_log(pod, "default")


def test_follow_streams_and_pending_is_reported(k8s_api):
    k8s_api.server.pod_start_delay = 1.5
    create(k8s_api, job("slow", [sys.executable, "-c", "import time\nfor i in range(3): print('tick', i, flush=True); time.sleep(0.3)"], workers=0))
    c = core(k8s_api)
    wait_for(lambda: k8s_api.server.pods_of("slow"), "the operator to create the pod", timeout=30, poll=0.05)
    with pytest.raises(ApiException) as e:
        c.read_namespaced_pod_log("slow-master-0", "default")
    assert e.value.status == 400 and "waiting to start" in e.value.body
    wait_for(lambda: k8s_api.server.pods_of("slow")[0].phase != "Pending", "the pod to start", timeout=30, poll=0.05)
    resp = c.read_namespaced_pod_log("slow-master-0", "default", follow=True, _preload_content=False)
    text = b"".join(resp.stream()).decode()
    assert [ln for ln in text.splitlines() if ln.startswith("tick")] == ["tick 0", "tick 1", "tick 2"]


def test_clean_pod_policy_and_delete_kill_processes(k8s_api):
    obj = job("sleepy", [sys.executable, "-c", "import time; time.sleep(600)"], workers=1)
    obj["spec"]["runPolicy"]["cleanPodPolicy"] = "Running"
    create(k8s_api, obj)
    wait_state(k8s_api, "sleepy", "Running")
    deadline = time.monotonic() + 30
    while not all(p.phase == "Running" for p in k8s_api.server.pods_of("sleepy")) and time.monotonic() < deadline:
        time.sleep(0.05)
    procs = [p.proc for p in k8s_api.server.pods_of("sleepy")]
    api(k8s_api).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "sleepy", propagation_policy="Foreground")
    assert k8s_api.server.job("sleepy") is None and k8s_api.server.pods_of("sleepy") == []
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(ApiException) as e:
        api(k8s_api).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "sleepy")
    assert e.value.status == 404


# --------------------------------------------------------------------------- a pod deleted, the operator recreating it

# Prints the rendezvous env it got, starts a child, then waits (a pod of a job still running).
ENV_THEN_WAIT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    keys = ("MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "RANK", "PET_NODE_RANK", "PET_NNODES", "WORLD_SIZE",
            "JOB_COMPLETION_INDEX")
    print("ENV", json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
    time.sleep(600)
""")


def pod_of(k8s_api, name):
    return next((p for p in k8s_api.server.pods_of(name.rsplit("-", 2)[0]) if p.name == name), None)


def logged_env(k8s_api, pod):
    try:
        text = core(k8s_api).read_namespaced_pod_log(pod, "default")
    except ApiException:  # not created yet, or Pending
        return None
    return next((json.loads(ln[4:]) for ln in text.splitlines() if ln.startswith("ENV ")), None)


def running(k8s_api, name, *pods):
    wait_state(k8s_api, name, "Running", timeout=30)
    wait_for(lambda: all(logged_env(k8s_api, p) for p in pods), "every pod to print its env", timeout=30, poll=0.05)


def test_deleted_pod_is_recreated_under_its_name(k8s_api):
    c = core(k8s_api)
    create(k8s_api, job("lost", [sys.executable, "-c", ENV_THEN_WAIT], workers=1))
    running(k8s_api, "lost", "lost-master-0", "lost-worker-0")
    old = pod_of(k8s_api, "lost-worker-0")
    before = logged_env(k8s_api, "lost-worker-0")
    tree = [(pid, start_time(pid)) for pid in [old.proc.pid, *descendants(old.proc.pid)]]
    assert len(tree) == 2 and before["RANK"] == "1" and before["MASTER_ADDR"] == "127.0.0.1"
    master_proc = pod_of(k8s_api, "lost-master-0").proc

    k8s_api.server.pod_start_delay = 1.0  # the new pod Pending a while: the job is seen Restarting
    said = c.delete_namespaced_pod("lost-worker-0", "default", grace_period_seconds=0)  # a node lost for good
    assert said.metadata.uid == old.uid and said.metadata.name == "lost-worker-0"
    assert k8s_api.server.requests[-1]["query"] == {"gracePeriodSeconds": "0"}
    assert not any(alive(pid, started) for pid, started in tree)  # the pod's whole process tree, at once
    new = wait_for(lambda: (p := pod_of(k8s_api, "lost-worker-0")) is not None and p.uid != old.uid and p,
                   "the operator to recreate the pod", timeout=10, poll=0.02)
    assert new.phase == "Pending" and new.log == bytearray()
    restarting = wait_state(k8s_api, "lost", "Restarting", timeout=10)
    assert "lost-worker-0" in restarting["status"]["conditions"][-1]["message"]
    wait_state(k8s_api, "lost", "Running", timeout=30)  # again, once the new pod runs
    conds = [x["type"] for x in k8s_api.server.job("lost")["status"]["conditions"]]
    assert conds == ["Created", "Running"], conds  # Running and Restarting replace each other
    wait_for(lambda: logged_env(k8s_api, "lost-worker-0"), "the new pod to print its env", timeout=30, poll=0.05)
    assert logged_env(k8s_api, "lost-worker-0") == before  # same master address, port and rank: it meets the others
    read = c.read_namespaced_pod("lost-worker-0", "default")
    assert read.metadata.uid == new.uid != old.uid and read.metadata.labels == old.labels
    assert read.status.phase == "Running" and read.status.container_statuses[0].restart_count == 0
    assert new.injected_env == old.injected_env and new.index == old.index == 0
    assert master_proc.poll() is None and pod_of(k8s_api, "lost-master-0").restarts == 0  # the master untouched
    created = [e for e in k8s_api.server.events if e["reason"] == "SuccessfulCreatePod"
               and e["involvedObject"]["name"] == "lost-worker-0"]
    assert len(created) == 2


TRAP_TERM = textwrap.dedent("""
    import os, signal, sys, time
    def term(*_):
        with open(sys.argv[1], "a") as f:
            f.write(f"TERM {os.getpid()}\\n")  # and carries on: only SIGKILL ends it
    signal.signal(signal.SIGTERM, term)
    print("ENV", '{"up": 1}', flush=True)
    time.sleep(600)
""")


def test_graceful_delete_sends_sigterm_then_sigkill(k8s_api, tmp_path):
    said = tmp_path / "said"
    create(k8s_api, job("grace", [sys.executable, "-c", TRAP_TERM, str(said)], workers=0))
    running(k8s_api, "grace", "grace-master-0")
    old = pod_of(k8s_api, "grace-master-0")
    t0 = time.monotonic()
    core(k8s_api).delete_namespaced_pod("grace-master-0", "default", grace_period_seconds=2)
    assert time.monotonic() - t0 < 1.0  # the handler does not wait out the grace period
    wait_for(lambda: said.exists() and said.read_text() == f"TERM {old.proc.pid}\n", "SIGTERM to reach the pod",
             timeout=5, poll=0.02)
    time.sleep(0.5)
    assert old.proc.poll() is None  # it ignored SIGTERM: still running within its grace period
    assert pod_of(k8s_api, "grace-master-0") is None  # gone from the API, not recreated while its processes live
    wait_for(lambda: old.proc.poll() is not None, "SIGKILL after the grace period", timeout=5, poll=0.02)
    assert time.monotonic() - t0 >= 2.0 and old.proc.returncode == -9
    new = wait_for(lambda: pod_of(k8s_api, "grace-master-0"), "the pod to be recreated", timeout=10, poll=0.02)
    assert new.uid != old.uid
    running(k8s_api, "grace", "grace-master-0")
    assert said.read_text() == f"TERM {old.proc.pid}\n"  # the new pod got no signal


def test_deleted_pod_of_a_finished_job_stays_gone_and_unknown_pods_are_404(k8s_api):
    c = core(k8s_api)
    # The worker ends a second after the master, which ends the job: a pod the finished job left
    # running still ends (the kubelet's part), as a slow worker did on a loaded machine.
    slow_worker = "import os, time; time.sleep(1.0 if os.environ['RANK'] != '0' else 0); print('ok')"
    create(k8s_api, job("done", [sys.executable, "-c", slow_worker], workers=1))
    wait_state(k8s_api, "done", "Succeeded")
    wait_for(lambda: all(p.phase == "Succeeded" for p in k8s_api.server.pods_of("done")), "both pods to end", timeout=30)
    c.delete_namespaced_pod("done-worker-0", "default", grace_period_seconds=0)
    time.sleep(0.5)  # ten reconciles
    assert [p.name for p in k8s_api.server.pods_of("done")] == ["done-master-0"]
    assert c.delete_namespaced_pod("done-master-0", "default", dry_run="All").metadata.name == "done-master-0"
    assert [p.name for p in k8s_api.server.pods_of("done")] == ["done-master-0"]  # a dry run deletes nothing
    with pytest.raises(ApiException) as e:
        c.delete_namespaced_pod("done-worker-0", "default")
    assert e.value.status == 404 and json.loads(e.value.body)["reason"] == "NotFound"
    assert json.loads(e.value.body)["message"] == 'pods "done-worker-0" not found'
    assert k8s_api.server.delete_pod("nope") is None
    k8s_api.server.delete_pods("done")  # garbage collection after the job: nothing comes back
    time.sleep(0.3)
    assert k8s_api.server.pods_of("done") == [] and "Restarting" not in json.dumps(k8s_api.server.job("done"))


def test_garbage_collection_of_a_running_job_recreates_nothing(k8s_api):
    create(k8s_api, job("gc", [sys.executable, "-c", ENV_THEN_WAIT], workers=1))
    running(k8s_api, "gc", "gc-master-0", "gc-worker-0")
    k8s_api.server.delete_pods("gc")
    time.sleep(0.3)
    assert k8s_api.server.pods_of("gc") == []


# --------------------------------------------------------------------------- a TrainJob's pod deleted: the Job controller

def trainjob(name: str, command: list[str], nodes: int = 2) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": nodes, "command": command}}}


def create_trainjob(k8s_api, obj):
    return api(k8s_api).create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", obj)


def node_pod(k8s_api, name, index):
    return next((p for p in k8s_api.server.pods_of(name) if p.index == index), None)


def nodes_running(k8s_api, name, nodes=2):
    return wait_for(lambda: (pods := sorted(k8s_api.server.pods_of(name), key=lambda p: p.index)) and len(pods) == nodes
                    and all(logged_env(k8s_api, p.name) for p in pods) and pods, "every pod to print its env",
                    timeout=30, poll=0.05)


def conditions(k8s_api, name):
    return [c["type"] for c in k8s_api.server.trainer.job(name).get("status", {}).get("conditions", [])]


def test_a_deleted_trainjob_pod_is_replaced_under_a_new_name_with_its_index(k8s_api):
    """A TrainJob's pods are an Indexed Job's: the Job controller replaces a deleted one at once, with a
    new name (a new random suffix) and the same completion index, while the TrainJob runs."""
    c = core(k8s_api)
    create_trainjob(k8s_api, trainjob("tj", [sys.executable, "-c", ENV_THEN_WAIT]))
    first, old = nodes_running(k8s_api, "tj")
    before = logged_env(k8s_api, old.name)
    assert before["PET_NODE_RANK"] == before["JOB_COMPLETION_INDEX"] == "1" and before["PET_MASTER_ADDR"] == "127.0.0.1"
    tree = [(pid, start_time(pid)) for pid in [old.proc.pid, *descendants(old.proc.pid)]]

    said = c.delete_namespaced_pod(old.name, "default", grace_period_seconds=0)  # a node lost for good
    assert said.metadata.uid == old.uid
    assert not any(alive(pid, started) for pid, started in tree)
    new = wait_for(lambda: (p := node_pod(k8s_api, "tj", 1)) is not None and p.uid != old.uid and p,
                   "the Job controller to replace the pod", timeout=10, poll=0.02)
    assert new.name != old.name and new.name[:-5] == old.name[:-5] == "tj-node-0-1-"  # a new random suffix
    assert new.annotations == old.annotations and new.labels == old.labels and new.injected_env == old.injected_env
    assert new.labels["batch.kubernetes.io/job-completion-index"] == "1"
    with pytest.raises(ApiException) as e:
        c.read_namespaced_pod(old.name, "default")
    assert e.value.status == 404  # the old name is not used again
    wait_for(lambda: logged_env(k8s_api, new.name), "the new pod to print its env", timeout=30, poll=0.05)
    assert logged_env(k8s_api, new.name) == before  # same master address, port and rank: it meets the others
    read = c.read_namespaced_pod(new.name, "default")
    assert read.status.phase == "Running" and read.status.container_statuses[0].restart_count == 0
    assert first.proc.poll() is None and first.restarts == 0 and node_pod(k8s_api, "tj", 0) is first  # untouched
    assert [e["involvedObject"]["name"] for e in k8s_api.server.events if e["reason"] == "SuccessfulCreate"] == \
        [first.name, old.name, new.name]
    assert conditions(k8s_api, "tj") == []  # a TrainJob that runs has no condition, a replaced pod adds none

    # The TrainJob deleted: its pods go with it and none is replaced.
    procs = [p.proc for p in k8s_api.server.pods_of("tj")]
    api(k8s_api).delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", "tj")
    time.sleep(0.3)  # six reconciles
    assert k8s_api.server.pods_of("tj") == [] and all(p.poll() is not None for p in procs)


def test_trainjob_pods_are_not_replaced_once_finished_collected_or_past_the_backoff_limit(k8s_api):
    c = core(k8s_api)
    create_trainjob(k8s_api, trainjob("done", [sys.executable, "-c", "print('ok')"]))
    wait_for(lambda: "Complete" in conditions(k8s_api, "done"), "the TrainJob to complete", timeout=30, poll=0.05)
    c.delete_namespaced_pod(node_pod(k8s_api, "done", 1).name, "default", grace_period_seconds=0)
    time.sleep(0.3)
    assert [p.index for p in k8s_api.server.pods_of("done")] == [0]  # a finished TrainJob: nothing comes back

    create_trainjob(k8s_api, trainjob("gc", [sys.executable, "-c", ENV_THEN_WAIT]))
    nodes_running(k8s_api, "gc")
    k8s_api.server.delete_pods("gc")  # garbage collection: its owner is gone too
    time.sleep(0.3)
    assert k8s_api.server.pods_of("gc") == [] and conditions(k8s_api, "gc") == []

    k8s_api.server.trainer.backoff_limit = 1  # a deleted pod counts as one of the Job's failed pods
    create_trainjob(k8s_api, trainjob("lossy", [sys.executable, "-c", ENV_THEN_WAIT]))
    nodes_running(k8s_api, "lossy")
    first = node_pod(k8s_api, "lossy", 0)
    c.delete_namespaced_pod(node_pod(k8s_api, "lossy", 1).name, "default", grace_period_seconds=0)
    again = wait_for(lambda: (p := node_pod(k8s_api, "lossy", 1)) and p.phase == "Running" and p, "the replacement", timeout=10)
    c.delete_namespaced_pod(again.name, "default", grace_period_seconds=0)
    wait_for(lambda: "Failed" in conditions(k8s_api, "lossy"), "the TrainJob to fail", timeout=10, poll=0.05)
    assert k8s_api.server.pods_of("lossy") == [] and first.proc.poll() is not None  # the JobSet deleted the rest
    message = k8s_api.server.trainer.job("lossy")["status"]["conditions"][-1]["message"]
    assert message == "jobset failed due to one or more job failures (first failed job: lossy-node-0)"


# Lists its output dir (empty in a fresh filesystem), marks it, says where it is, then waits.
MARK_OUTPUT = textwrap.dedent("""
    import os, time
    out = os.environ["OUT"]
    os.makedirs(out, exist_ok=True)
    seen = sorted(os.listdir(out))
    open(os.path.join(out, "mark-" + os.environ["RANK"]), "w").close()
    print("FS", out, os.environ["NEAR"], os.environ["TMPDIR"], seen, os.getcwd(), flush=True)
    time.sleep(600)
""")


def fs_line(k8s_api, pod):
    try:
        text = core(k8s_api).read_namespaced_pod_log(pod, "default")
    except ApiException:  # not created yet, or Pending
        return None
    return next((ln.split(" ", 5)[1:] for ln in text.splitlines() if ln.startswith("FS ")), None)


def test_own_filesystems_give_each_pod_and_each_new_pod_its_own_workspace(k8s_api):
    k8s_api.server.own_filesystems = True
    env = [{"name": "OUT", "value": "/workspace/outputs/x"}, {"name": "NEAR", "value": "/workspacex/y"}]
    obj = job("fs", [sys.executable, "-c", MARK_OUTPUT], workers=1, env=env)
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["workingDir"] = "/workspace/proj"
    create(k8s_api, obj)
    wait_for(lambda: fs_line(k8s_api, "fs-master-0") and fs_line(k8s_api, "fs-worker-0"), "both pods to start",
             timeout=30, poll=0.05)
    master, worker = pod_of(k8s_api, "fs-master-0"), pod_of(k8s_api, "fs-worker-0")
    assert master.fs_root != worker.fs_root
    assert worker.fs_root.endswith(f"/fs-worker-0-{worker.uid[:8]}/fs")
    for pod in (master, worker):
        out, near, tmp, seen, cwd = fs_line(k8s_api, pod.name)
        assert out == pod.fs_root + "/workspace/outputs/x" and near == "/workspacex/y"  # only /workspace and below
        assert tmp == pod.fs_root + "/tmp" and seen == "[]"
        assert (Path(pod.fs_root) / "workspace/outputs/x" / f"mark-{pod.injected_env['RANK']}").is_file()
        # a workingDir under /workspace is in it too; none: the pod's own folder
        assert cwd == (pod.fs_root + "/workspace/proj" if pod is worker else str(Path(pod.fs_root).parent))

    body = client.V1DeleteOptions(grace_period_seconds=0)  # kubectl's --grace-period=0 --force, in the body
    core(k8s_api).delete_namespaced_pod("fs-worker-0", "default", body=body)
    new = wait_for(lambda: (p := pod_of(k8s_api, "fs-worker-0")) is not None and p.uid != worker.uid and p,
                   "the pod to be recreated", timeout=10, poll=0.02)
    wait_for(lambda: fs_line(k8s_api, "fs-worker-0"), "the new pod to start", timeout=30, poll=0.05)
    out, _, _, seen, _ = fs_line(k8s_api, "fs-worker-0")
    assert new.fs_root != worker.fs_root and out == new.fs_root + "/workspace/outputs/x"
    assert seen == "[]"  # a new container: an empty /workspace, not the old pod's
    assert (Path(worker.fs_root) / "workspace/outputs/x/mark-1").is_file()  # the old one is left on this machine


EXIT_BY_RANK = textwrap.dedent("""
    import os, signal, sys, time
    flag, back = os.path.join(sys.argv[1], "killed-once"), os.path.join(sys.argv[1], "back")
    if os.environ["RANK"] == "1" and not os.path.exists(flag):  # the worker is killed once (an OOM kill)
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ["RANK"] == "1":
        open(back, "w").close()
    while not os.path.exists(back):  # the master ends once the recreated worker ran
        time.sleep(0.05)
    print("ran", os.environ["RANK"], flush=True)
    sys.exit(int(sys.argv[2]) if os.environ["RANK"] == "0" else 0)
""")


@pytest.mark.parametrize("master_exit", [0, 3])
def test_exit_code_policy_recreates_a_killed_pod_and_fails_the_job_on_1_to_127(k8s_api, tmp_path, master_exit):
    """restartPolicy ExitCode (CONTRACT 3.5): the pod's own policy is Never; a container that exits 128 or
    more (here 137, SIGKILL) is deleted and recreated under its name (Restarting), one that exits 1-127
    fails the job."""
    obj = job(f"ec{master_exit}", [sys.executable, "-c", EXIT_BY_RANK, str(tmp_path), str(master_exit)], workers=1)
    for rs in obj["spec"]["pytorchReplicaSpecs"].values():
        rs["restartPolicy"] = "ExitCode"
    create(k8s_api, obj)
    name = f"ec{master_exit}"
    final = wait_state(k8s_api, name, "Failed" if master_exit else "Succeeded", timeout=60)
    assert (tmp_path / "killed-once").exists()
    assert [e for e in k8s_api.server.events if e["reason"] == "ExitedWithCode"
            and e["involvedObject"]["name"] == f"{name}-worker-0" and "code 137" in e["message"]]
    created = [e for e in k8s_api.server.events if e["reason"] == "SuccessfulCreatePod"
               and e["involvedObject"]["name"] == f"{name}-worker-0"]
    assert len(created) == 2 and final["status"]["conditions"][-1]["type"] in ("Succeeded", "Failed")
    worker = pod_of(k8s_api, f"{name}-worker-0")
    assert worker.restarts == 0 and worker.restart_policy == "Never"  # recreated, not restarted in place
    master = pod_of(k8s_api, f"{name}-master-0")
    assert master.exit_code == master_exit and master.restarts == 0
