"""The loopback API server with the real kubernetes client: Status objects, strictness, operator behaviour."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
import time

import pytest
from fake_apiserver import expand_refs
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from testkit import needs_crd, wait_for

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
