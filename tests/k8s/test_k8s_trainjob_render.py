"""Rendering TrainJobs (``k8s.api: trainjob``, Kubeflow Trainer v2.3): goldens, each validated strictly
against the upstream TrainJob CRD and Trainer's webhook rules; refusals at the spec's lines; tables.

Update the goldens with DDPJOB_UPDATE_GOLDEN=1 (then read the diff before committing).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from goldens import assert_golden
from test_k8s_render import torchrun_of
from trainjob_kit import needs_trainjob_crd, trainjob_schema

from launcher.core.errors import SpecError
from launcher.core.states import JobState
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.k8s.cluster.pods import pod_ref, sort_key
from launcher.targets.k8s.objects import trainjob
from launcher.targets.k8s.payload import masked_env
from launcher.targets.k8s.target import KubernetesTarget
from launcher.targets.k8s.validation.trainjob_rules import validate_trainjob

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
CTX_ID = "demo-abcde"
TJ = ["k8s.api=trainjob"]


def ctx(job_id: str = CTX_ID, inputs=None) -> PlanContext:
    return PlanContext(job_id=job_id, run_dir=f"/home/u/.ddpjob/runs/{job_id}", home="/home/u", cwd="/work/proj",
                       inputs=inputs)


def plan_of(spec_file: str | None = None, overrides: list[str] = (), base: dict[str, Any] | None = None,
            job_id: str = CTX_ID):
    loaded = load_spec(REPO / "jobs" / spec_file if spec_file else None, overrides=list(overrides), base=base)
    target = KubernetesTarget()
    return target.plan(loaded, ctx(job_id, target.inputs(loaded, online=False)))  # as render does


def pod_patch(obj: dict[str, Any]) -> dict[str, Any]:
    (patch,) = obj["spec"]["runtimePatches"]
    (rj,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rj["name"] == "node"
    return rj["template"]["spec"]["template"]


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in obj["spec"]["trainer"]["env"]}


DEFAULT_RUNTIME = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}


def common_checks(text: str, plan, runtime: dict[str, str] = DEFAULT_RUNTIME) -> list[dict[str, Any]]:
    objs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert objs == masked_env(plan.payload.manifests, frozenset()) and plan.payload.api == "trainjob"  # the text is what submit sends
    assert "&id" not in text and "*id" not in text
    assert "checked: TrainJob CRD schema (strict)" in text
    for obj in objs:
        assert validate_trainjob(obj, trainjob_schema()) == [], obj["metadata"]["name"]
        assert obj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and obj["kind"] == "TrainJob"
        assert obj["spec"]["runtimeRef"] == runtime
        t = obj["spec"]["trainer"]
        assert isinstance(t["numNodes"], int) and isinstance(t["numProcPerNode"], int)
        assert torchrun_of(t["command"])[0] == "torchrun"
        assert not any(a.startswith(("--nnodes", "--node-rank", "--master", "--rdzv", "--nproc")) for a in torchrun_of(t["command"]))
        names = [e["name"] for e in t["env"]]
        assert names == sorted(names) and len(names) == len(set(names))
        assert not [n for n in names if n.startswith("PET_")]  # the torch plugin's; its webhook refuses them
        assert env_of(obj)["PYTHONUNBUFFERED"] == "1"  # Trainer v2 does not set it
        for part in (t.get("resourcesPerNode") or {}).values():
            assert all(isinstance(v, str) for v in part.values())
        pod = pod_patch(obj)
        assert pod["metadata"]["labels"]["ddpjob/job-id"] == CTX_ID
        shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        (c,) = pod["spec"]["containers"]
        assert c["name"] == "node" and set(c) == {"name", "volumeMounts"}  # a patch of node may not set env
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    return objs


@needs_trainjob_crd
def test_golden_one_node():
    plan = plan_of("linreg.yaml", TJ)
    text = plan.render()
    assert_golden(GOLDEN / "trainjob_one_node.yaml", text)
    (obj,) = common_checks(text, plan)
    assert obj["spec"]["trainer"]["numNodes"] == 1 and obj["spec"]["trainer"]["numProcPerNode"] == 2
    env = env_of(obj)
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["DDPJOB_OUTPUT_DIR"] == f"/workspace/outputs/{CTX_ID}"
    assert pod_patch(obj)["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}


@needs_trainjob_crd
def test_golden_two_nodes():
    plan = plan_of("quickstart.yaml", TJ)
    text = plan.render()
    assert_golden(GOLDEN / "trainjob_two_nodes.yaml", text)
    (obj,) = common_checks(text, plan)
    t = obj["spec"]["trainer"]
    assert t["numNodes"] == 2 and t["numProcPerNode"] == 1 and t["image"] == "ghcr.io/ddpjob/train:0.1.0"
    assert torchrun_of(t["command"])[:6] == ["torchrun", "--max-restarts", "1", "--tee", "3", "-m"]
    assert t["resourcesPerNode"] == {"limits": {"memory": "2Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}
    assert obj["metadata"]["labels"] == {"ddpjob/job-id": CTX_ID}
    assert "namespace" not in obj["metadata"]


@needs_trainjob_crd
def test_golden_gpus():
    plan = plan_of("cifar.yaml", TJ + ["nodes=3", "resources.gpus=4"])
    text = plan.render()
    assert_golden(GOLDEN / "trainjob_gpus.yaml", text)
    (obj,) = common_checks(text, plan)
    t = obj["spec"]["trainer"]
    assert t["numNodes"] == 3 and t["numProcPerNode"] == 4  # procs_per_node auto = GPUs per node
    res = t["resourcesPerNode"]
    assert res["limits"]["nvidia.com/gpu"] == "4" and res["requests"]["nvidia.com/gpu"] == "4" and "cpu" not in res["limits"]
    # the verdict's emptyDir (objects/runner.py): recovery is on (3 nodes)
    assert {v["name"] for v in pod_patch(obj)["spec"]["volumes"]} == {"dshm", "data", "outputs", "ddpjob-verdict"}


VOLUMES_SPEC = {
    "name": "demo", "image": "registry.example.com/team/train:1.2", "nodes": 2, "procs_per_node": 1,
    "command": ["python", "train.py", "--data", "/data"],
    "env": {"WANDB_PROJECT": "demo"},
    "resources": {"memory": "8Gi", "shm": "1Gi"},
    "max_restarts": 2,
    "output_dir": "/mnt/out",
    "k8s": {
        "api": "trainjob", "namespace": "ml", "context": "prod", "image_pull_secrets": ["regcred"],
        "service_account": "trainer", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "queue": "team-a",
        "volumes": [
            {"name": "data", "mount_path": "/data", "pvc": "imagenet", "read_only": True},
            {"name": "cfg", "mount_path": "/etc/train", "config_map": "train-config"},
            {"name": "creds", "mount_path": "/var/run/creds", "secret": "s3-creds", "read_only": True},
            {"name": "scratch", "mount_path": "/scratch", "host_path": "/mnt/nvme", "sub_path": "ddpjob"},
        ],
        "env_refs": {"WANDB_API_KEY": {"secret": "wandb", "key": "api-key"},
                     "DATA_VERSION": {"config_map": "train-config", "key": "version", "optional": True}},
        "annotations": {"example.com/owner": "ml-team"}, "labels": {"team": "ml"},
        "istio_inject": True, "rdma": True, "cpu": "3500m",
        "runtime": {"kind": "TrainingRuntime", "name": "torch-h100"},
    },
}


@needs_trainjob_crd
def test_golden_volumes_and_secrets():
    plan = plan_of(base=VOLUMES_SPEC)
    text = plan.render()
    assert_golden(GOLDEN / "trainjob_volumes_secrets.yaml", text)
    (obj,) = common_checks(text, plan, {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "torch-h100"})
    meta = obj["metadata"]
    assert meta["namespace"] == "ml" and meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert meta["labels"]["team"] == "ml" and meta["annotations"] == {"example.com/owner": "ml-team"}
    pod = pod_patch(obj)
    # The TrainJob's labels and annotations do not reach the pods: the patch carries them.
    assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["annotations"] == {"example.com/owner": "ml-team"}
    assert pod["spec"]["serviceAccountName"] == "trainer" and pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    env = env_of(obj)
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert env["DATA_VERSION"] == {"configMapKeyRef": {"name": "train-config", "key": "version", "optional": True}}
    assert env["NCCL_IB_DISABLE"] == "0" and env["DDPJOB_OUTPUT_DIR"] == "/mnt/out"
    assert obj["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "3500m"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"] == {"claimName": "imagenet", "readOnly": True}
    assert vols["creds"]["secret"] == {"secretName": "s3-creds"}
    assert {"name": "scratch", "mountPath": "/scratch", "subPath": "ddpjob"} in pod["spec"]["containers"][0]["volumeMounts"]


@needs_trainjob_crd
def test_golden_sweep():
    plan = plan_of("sweep.yaml", TJ)
    text = plan.render()
    assert_golden(GOLDEN / "trainjob_sweep.yaml", text)
    objs = common_checks(text, plan)
    assert [o["metadata"]["name"] for o in objs] == [f"{CTX_ID}-{i}" for i in range(4)]
    assert {o["metadata"]["labels"]["ddpjob/sweep-id"] for o in objs} == {CTX_ID}
    assert [o["metadata"]["labels"]["ddpjob/sweep-index"] for o in objs] == ["0", "1", "2", "3"]
    assert [pod_patch(o)["metadata"]["labels"]["ddpjob/sweep-index"] for o in objs] == ["0", "1", "2", "3"]
    cmd = objs[3]["spec"]["trainer"]["command"]
    assert cmd[cmd.index("--lr") + 1] == "0.01" and cmd[cmd.index("--seed") + 1] == "2"
    assert env_of(objs[2])["DDPJOB_OUTPUT_DIR"] == f"/workspace/outputs/{CTX_ID}/sweep-2"


@needs_trainjob_crd
def test_stall_fail_keeps_its_verdict_in_a_volume_the_crd_and_the_webhook_accept():
    """The emptyDir of the stall mark (objects/runner.py) goes through the runtime patch, which the
    TrainJob CRD and the webhook's rules allow (a patch of the container ``node`` may not set env: its
    variable is in the trainer's env)."""
    from launcher.targets.k8s.objects import runner

    obj = plan_of("quickstart.yaml", TJ + ["stall.action=fail"]).payload.manifests[0]
    assert {"name": runner.MARK_VOLUME, "mountPath": runner.MARK_DIR} in pod_patch(obj)["spec"]["containers"][0][
        "volumeMounts"]
    assert env_of(obj)[runner.MARK_ENV] == f"{runner.MARK_DIR}/verdict"
    assert [str(i) for i in validate_trainjob(obj, trainjob_schema())] == []


# --------------------------------------------------------------------------- the checks can fail

@needs_trainjob_crd
@pytest.mark.parametrize("path,value,words", [
    (("spec", "trainer", "numProcPerNode"), "auto", "is not of type 'integer'"),  # int32 only in v2.3.0
    (("spec", "trainer", "numNodes"), 2**31, "out of range for int32"),
    (("spec", "trainer", "nprocPerNode"), 1, "unknown field 'nprocPerNode'"),
    (("spec", "podTemplateOverrides"), [], "unknown field 'podTemplateOverrides'"),  # gone since v2.2
    (("spec", "runtimeRef", "name"), "", "does not match|should be non-empty|is too short"),
])
def test_strict_check_refuses_what_the_api_server_would(path, value, words):
    import re

    obj = plan_of("quickstart.yaml", TJ).payload.manifests[0]
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    messages = [str(i) for i in validate_trainjob(obj, trainjob_schema())]
    assert any(re.search(words, m) for m in messages), messages


@pytest.mark.parametrize("mutate,words", [
    (lambda o: o["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "3"}), "reserved"),
    (lambda o: o["spec"]["trainer"].update(command=["tune", "run"]), "torchtune"),
    (lambda o: o["spec"]["trainer"].update(numNodes=0), ">= 1"),
    (lambda o: o["spec"]["runtimePatches"][0].update(manager="ddpjob"), "domain-prefixed"),
    (lambda o: o["spec"]["runtimeRef"].update(kind="Runtime"), "unsupported runtime"),
    (lambda o: pod_patch(o)["spec"]["containers"][0].update(env=[{"name": "A", "value": "1"}]), "refuses env"),
    (lambda o: pod_patch(o)["spec"]["containers"][0].update(name="trainer"), "container is 'node'"),
    (lambda o: o["metadata"].update(name="a" * 49), "JobSet would name a pod"),
])
def test_structural_rules_without_a_crd(mutate, words):
    obj = plan_of("quickstart.yaml", TJ).payload.manifests[0]
    assert validate_trainjob(obj, None) == []
    mutate(obj)
    messages = [str(i) for i in validate_trainjob(obj, None)]
    assert any(words in m for m in messages), messages


# --------------------------------------------------------------------------- refused at the spec's lines

@pytest.mark.parametrize("line,field,words", [
    ("  elastic: {min_nodes: 2, max_nodes: 3}", "k8s.elastic", "not elastic"),
    ("  restart_policy: Never", "k8s.restart_policy", "restart policy comes from the runtime"),
    ("  backoff_limit: 3", "k8s.backoff_limit", "backoff limit"),
    ("  ttl_seconds_after_finished: 60", "k8s.ttl_seconds_after_finished", "no TTL"),
    ("  priority_class: high", "k8s.priority_class", "priorityClassName"),
    ("  image_pull_policy: Always", "k8s.image_pull_policy", "imagePullPolicy"),
    ("  workdir: /w", "k8s.workdir", "workingDir"),
    ("  env_from: [{secret: s3}]", "k8s.env_from", "no envFrom"),
    ("  runtime: {kind: Runtime}", "k8s.runtime.kind", "ClusterTrainingRuntime"),
    ("  labels: {jobset.sigs.k8s.io/jobset-name: other}", "k8s.labels.jobset.sigs.k8s.io/jobset-name", "set on the pods by JobSet"),
    ("  annotations: {batch.kubernetes.io/job-completion-index: '0'}", "k8s.annotations.batch.kubernetes.io/job-completion-index",
     "set on the pods by JobSet"),
])
def test_options_without_a_trainjob_equivalent_are_refused_at_their_line(tmp_path, line, field, words):
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: demo\nimage: img:1\nnodes: 2\ncommand: [python, t.py]\nk8s:\n  api: trainjob\n{line}\n")
    with pytest.raises(SpecError) as err:
        loaded = load_spec(spec)
        KubernetesTarget().plan(loaded, ctx())
    text = err.value.render()
    assert f"{spec}:7:" in text and f": {field}: " in text and words in text, text
    assert "nothing was submitted" in text


def test_master_port_and_a_long_name_are_refused(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: demo\nimage: img:1\nnodes: 11\nmaster_port: 29501\ncommand: [python, t.py]\nk8s:\n  api: trainjob\n")
    with pytest.raises(SpecError) as err:
        KubernetesTarget().plan(load_spec(spec), ctx("d" * 43 + "-abcd"))
    text = err.value.render()
    assert f"{spec}:4:1: master_port: " in text and "PET_MASTER_PORT=29500" in text, text
    assert f"{spec}:1:1: name: too long for Trainer v2" in text and "-node-0-10-xxxxx" in text, text
    KubernetesTarget().plan(load_spec(spec, overrides=["master_port=null"]), ctx("d" * 42 + "-abcd"))  # 63: fits


def test_controller_env_is_refused_at_its_line(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nk8s:\n  api: trainjob\nenv:\n  PET_NNODES: '2'\n")
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert f"{spec}:7:3: env.PET_NNODES" in err.value.render()
    # What the training operator owns but Trainer v2 does not set is the spec's to give.
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nk8s:\n  api: trainjob\nenv:\n  PYTHONUNBUFFERED: '0'\n")
    obj = KubernetesTarget().plan(load_spec(spec), ctx()).payload.manifests[0]
    assert env_of(obj)["PYTHONUNBUFFERED"] == "0"


def test_runtime_only_with_trainjob(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nk8s:\n  runtime: {name: torch-h100}\n")
    with pytest.raises(SpecError) as err:
        KubernetesTarget().plan(load_spec(spec), ctx())
    assert f"{spec}:5:3: k8s.runtime: a training runtime is used only by k8s.api trainjob" in err.value.render()


# --------------------------------------------------------------------------- tables

@pytest.mark.parametrize("status,state,words", [
    (None, JobState.PENDING, "not reconciled"),
    ({"jobsStatus": [{"name": "node", "active": 0, "ready": 0}]}, JobState.PENDING, "waiting"),
    ({"jobsStatus": [{"name": "node", "active": 1, "ready": 0}]}, JobState.PENDING, "scheduled or started"),
    ({"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}, JobState.RUNNING, "running"),
    ({"conditions": [{"type": "Complete", "status": "True", "message": "jobset completed successfully"}]},
     JobState.SUCCEEDED, "completed"),
    ({"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "first failed job"}],
      "jobsStatus": [{"name": "node", "ready": 1}]}, JobState.FAILED, "first failed job"),
    ({"conditions": [{"type": "Suspended", "status": "True", "message": "TrainJob is suspended"}]},
     JobState.PENDING, "suspended"),
    ({"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"}],
      "jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}, JobState.RUNNING, "running"),
    ({"conditions": [{"type": "Hibernating", "status": "True", "message": "?"}]}, JobState.UNKNOWN, "?"),
])
def test_condition_table(status, state, words):
    got, message = trainjob.condition_state(status)
    assert got == state and words in message


def test_condition_table_covers_trainer_conditions():
    assert set(trainjob.TRAINJOB_CONDITIONS) == {"Complete", "Failed", "Suspended"}
    assert trainjob.jobs_summary({"jobsStatus": [{"name": "node", "ready": 1, "active": 1}]}) == "node: 1 ready, 1 active (jobs)"


@pytest.mark.parametrize("pod,expected", [
    ("demo-abcde-node-0-0-x7k2q", (0, 0, "node-0")),
    ("demo-abcde-node-0-11-x7k2q", (0, 11, "node-11")),
    ("demo-abcde-1-node-0-1-abcde", (1, 1, "task1 node-1")),
    ("demo-abcde-node-0-1", None),  # not a JobSet pod name
    ("other-node-0-1-abcde", None),  # another job's
])
def test_trainjob_pods_are_nodes_by_completion_index(pod, expected):
    elements = [{"index": 0, "name": "demo-abcde"}, {"index": 1, "name": "demo-abcde-1"}]
    multi = pod.startswith("demo-abcde-1-")
    ref = pod_ref(pod, elements if multi else elements[:1], multi)
    assert (ref and (ref.task, ref.node, ref.label)) == expected
    assert sort_key("j-node-0-2-abcde") < sort_key("j-node-0-10-abcde")


@pytest.mark.parametrize("path,field", [
    (("metadata", "name"), ("name",)),
    (("spec", "trainer", "numNodes"), ("nodes",)),
    (("spec", "trainer", "env", 3, "name"), ("env",)),
    (("spec", "trainer", "resourcesPerNode", "limits"), ("resources",)),
    (("spec", "runtimeRef", "name"), ("k8s", "runtime")),
    (trainjob.PATCH_POD + ("spec", "volumes", 1), ("k8s", "volumes")),
    (trainjob.PATCH_POD + ("spec", "tolerations", 0), ("k8s", "tolerations")),
    (trainjob.PATCH_POD + ("metadata", "labels"), ("k8s", "labels")),
    (("spec", "somethingNew"), ("k8s",)),
])
def test_manifest_path_maps_to_spec_field(path, field):
    assert trainjob.spec_field(path) == field
    assert trainjob.spec_field(("spec", "trainer", "resourcesPerNode", "requests", "cpu"), k8s_cpu=True) == ("k8s", "cpu")


def test_render_does_not_import_kubernetes(tmp_path):
    probe = (
        "import sys\n"
        "sys.argv = ['ddpjob'] + sys.argv[1:]\n"
        "try:\n"
        "    from launcher.cli.main import cli\n"
        "    cli(prog_name='ddpjob')\n"
        "except SystemExit as e:\n"
        "    heavy = sorted(m for m in ('kubernetes', 'torch', 'submitit') if m in sys.modules)\n"
        "    sys.stderr.write('HEAVY=' + ','.join(heavy) + ' CODE=' + str(e.code) + '\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe, "render", str(REPO / "jobs" / "cifar.yaml"), "--target", "k8s",
                           "--set", "k8s.api=trainjob"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "HEAVY= CODE=0" in proc.stderr, proc.stderr[-2000:]
    assert "kind: TrainJob" in proc.stdout and "numNodes: 2" in proc.stdout
