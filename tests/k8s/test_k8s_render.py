"""Rendering PyTorchJobs: goldens (each also checked by the strict CRD validator), tables, spec checks.

Update the goldens with DDPJOB_UPDATE_GOLDEN=1 (then read the diff before committing).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_apiserver import upstream_schema
from goldens import assert_golden
from testkit import needs_crd

from launcher.core.errors import SpecError
from launcher.core.states import JobState
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.objects.pytorchjob import (
    NOT_RECONCILED,
    PYTORCHJOB_CONDITIONS,
    condition_state,
    replica_summary,
    spec_field,
)
from launcher.targets.k8s.objects.render import kubelet_escape
from launcher.targets.k8s.payload import masked_env
from launcher.targets.k8s.target import KubernetesTarget
from launcher.targets.k8s.validation.schema import validate_pytorchjob
from launcher.targets.shared.launch import torchrun_escape

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
CTX_ID = "demo-abcde"


def ctx(job_id: str = CTX_ID, inputs=None) -> PlanContext:
    return PlanContext(job_id=job_id, run_dir=f"/home/u/.ddpjob/runs/{job_id}", home="/home/u", cwd="/work/proj",
                       inputs=inputs)


def check_golden(name: str, text: str) -> None:
    assert_golden(GOLDEN / name, text)


def plan_of(spec_file: str | None = None, overrides: list[str] = (), base: dict[str, Any] | None = None,
            job_id: str = CTX_ID):
    loaded = load_spec(REPO / "jobs" / spec_file if spec_file else None, overrides=list(overrides), base=base)
    target = KubernetesTarget()
    return target.plan(loaded, ctx(job_id, target.inputs(loaded, online=False)))  # as render does


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def replicas(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["pytorchReplicaSpecs"]


def container(obj: dict[str, Any], rtype: str = "Master") -> dict[str, Any]:
    return replicas(obj)[rtype]["template"]["spec"]["containers"][0]


def torchrun_of(command: list[str]) -> list[str]:
    """torchrun's argv in a container's command: after the pod runner's ``python3 -c BOOT`` (checked), or
    the whole command when it runs bare (an elastic job)."""
    if command[0] == "torchrun":
        return command
    assert command[:3] == ["python3", "-c", runner.BOOT], command[:3]
    return command[3:]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def common_checks(text: str, plan) -> list[dict[str, Any]]:
    objs = docs(text)
    assert objs == masked_env(plan.payload.manifests, frozenset())  # the text is exactly what submit sends
    assert "&id" not in text and "*id" not in text  # no YAML anchors/aliases
    for obj in objs:
        assert validate_pytorchjob(obj, upstream_schema()) == [], obj["metadata"]["name"]
        assert obj["apiVersion"] == "kubeflow.org/v1" and obj["kind"] == "PyTorchJob"
        assert replicas(obj)["Master"]["replicas"] == 1
        assert isinstance(obj["spec"]["nprocPerNode"], str)
        assert obj["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
        for rtype, rs in replicas(obj).items():
            c = container(obj, rtype)
            assert c["name"] == "pytorch"
            assert c["ports"][0]["name"] == "pytorchjob-port"
            assert torchrun_of(c["command"])[0] == "torchrun"
            names = [e["name"] for e in c["env"]]
            assert names == sorted(names) and len(names) == len(set(names))
            assert not {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"} & set(names)
            assert not [n for n in names if n.startswith("PET_")]
            assert "PYTHONUNBUFFERED" not in names  # the operator sets it in every pod, after ours
            assert not any(a.startswith(("--nnodes", "--node-rank", "--master", "--rdzv")) for a in torchrun_of(c["command"]))
            for part in (c.get("resources") or {}).values():
                assert all(isinstance(v, str) for v in part.values())
            shm = next(v for v in rs["template"]["spec"]["volumes"] if v["name"] == "dshm")
            assert shm["emptyDir"]["medium"] == "Memory"
            assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
            assert "restartPolicy" not in rs["template"]["spec"]  # the operator sets it from the replica's
    return objs


@needs_crd
def test_golden_one_node():
    plan = plan_of("linreg.yaml")
    text = plan.render()
    check_golden("k8s_one_node.yaml", text)
    (obj,) = common_checks(text, plan)
    assert list(replicas(obj)) == ["Master"]  # no Worker for a single node
    assert obj["spec"]["nprocPerNode"] == "2"
    env = env_of(container(obj))
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_DISABLE"] == "1" and env["NCCL_DEBUG"] == "WARN"
    assert env["DDPJOB_OUTPUT_DIR"] == f"/workspace/outputs/{CTX_ID}" and env["DDPJOB_SWEEP_INDEX"] == "0"
    assert replicas(obj)["Master"]["template"]["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}


@needs_crd
def test_golden_two_nodes():
    plan = plan_of("quickstart.yaml")
    text = plan.render()
    check_golden("k8s_two_nodes.yaml", text)
    (obj,) = common_checks(text, plan)
    assert replicas(obj)["Worker"]["replicas"] == 1
    c = container(obj, "Worker")
    assert torchrun_of(c["command"])[:4] == ["torchrun", "--max-restarts", "1", "--tee"]
    assert c["command"][-len(["-m", "launcher.train"]) - 16:][:2] == ["-m", "launcher.train"]
    assert c["resources"] == {"limits": {"memory": "2Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}
    assert obj["metadata"]["labels"] == {"ddpjob/job-id": CTX_ID}
    assert replicas(obj)["Worker"]["template"]["metadata"]["labels"] == {"ddpjob/job-id": CTX_ID}
    # The pod runner may end the run (a loss recovery cannot survive): ExitCode takes its exit as final.
    assert replicas(obj)["Master"]["restartPolicy"] == "ExitCode"


@needs_crd
def test_golden_gpus():
    plan = plan_of("cifar.yaml", ["nodes=3", "resources.gpus=4"])
    text = plan.render()
    check_golden("k8s_gpus.yaml", text)
    (obj,) = common_checks(text, plan)
    assert replicas(obj)["Worker"]["replicas"] == 2
    assert obj["spec"]["nprocPerNode"] == "4"  # procs_per_node auto = GPUs per node
    res = container(obj)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "4" and res["requests"]["nvidia.com/gpu"] == "4"
    assert "cpu" not in res["limits"]  # CPU is a request only
    assert env_of(container(obj))["OMP_NUM_THREADS"] == "2"  # 8 cores / 4 processes


VOLUMES_SPEC = {
    "name": "demo", "image": "registry.example.com/team/train:1.2", "nodes": 2, "procs_per_node": 1,
    "command": ["python", "train.py", "--data", "/data"],
    "env": {"WANDB_PROJECT": "demo"},
    "resources": {"memory": "8Gi", "shm": "1Gi"},
    "max_restarts": 2,
    "output_dir": "/mnt/out",
    "k8s": {
        "namespace": "ml", "context": "prod", "image_pull_policy": "Always", "image_pull_secrets": ["regcred"],
        "service_account": "trainer", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priority_class": "high", "queue": "team-a",
        "volumes": [
            {"name": "data", "mount_path": "/data", "pvc": "imagenet", "read_only": True},
            {"name": "cfg", "mount_path": "/etc/train", "config_map": "train-config"},
            {"name": "creds", "mount_path": "/var/run/creds", "secret": "s3-creds", "read_only": True},
            {"name": "scratch", "mount_path": "/scratch", "host_path": "/mnt/nvme", "sub_path": "ddpjob"},
        ],
        "env_refs": {"WANDB_API_KEY": {"secret": "wandb", "key": "api-key"},
                     "DATA_VERSION": {"config_map": "train-config", "key": "version", "optional": True}},
        "env_from": [{"secret": "s3-creds", "prefix": "S3_"}, {"config_map": "train-env"}],
        "annotations": {"example.com/owner": "ml-team"}, "labels": {"team": "ml"},
        "ttl_seconds_after_finished": 3600, "restart_policy": "ExitCode", "backoff_limit": 5,
        "istio_inject": True, "rdma": True, "workdir": "/workspace/project", "cpu": "3500m",
    },
}


@needs_crd
def test_golden_volumes_and_secrets():
    plan = plan_of(base=VOLUMES_SPEC)
    text = plan.render()
    check_golden("k8s_volumes_secrets.yaml", text)
    (obj,) = common_checks(text, plan)
    meta = obj["metadata"]
    assert meta["namespace"] == "ml" and meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert meta["labels"]["team"] == "ml" and meta["annotations"] == {"example.com/owner": "ml-team"}
    pod = replicas(obj)["Worker"]["template"]
    assert "sidecar.istio.io/inject" not in pod["metadata"]["annotations"]  # istio_inject: true
    assert pod["spec"]["serviceAccountName"] == "trainer" and pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    c = container(obj, "Worker")
    env = env_of(c)
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert env["NCCL_IB_DISABLE"] == "0"  # rdma
    assert env["DDPJOB_OUTPUT_DIR"] == "/mnt/out"
    assert c["envFrom"][0] == {"prefix": "S3_", "secretRef": {"name": "s3-creds"}}
    assert c["workingDir"] == "/workspace/project" and c["imagePullPolicy"] == "Always"
    assert c["resources"]["requests"]["cpu"] == "3500m"
    assert replicas(obj)["Master"]["restartPolicy"] == "ExitCode"
    assert obj["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 5, "ttlSecondsAfterFinished": 3600}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"] == {"claimName": "imagenet", "readOnly": True}
    assert vols["creds"]["secret"] == {"secretName": "s3-creds"}
    assert {"name": "scratch", "mountPath": "/scratch", "subPath": "ddpjob"} in c["volumeMounts"]
    assert "api-key" not in json.dumps(env["WANDB_API_KEY"]).replace('"key": "api-key"', "")


@needs_crd
def test_golden_elastic():
    plan = plan_of("quickstart.yaml", ["nodes=3", "k8s.elastic={min_nodes: 2, max_nodes: 4}"])
    text = plan.render()
    check_golden("k8s_elastic.yaml", text)
    (obj,) = common_checks(text, plan)
    assert obj["spec"]["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "maxRestarts": 1}
    assert "nProcPerNode" not in obj["spec"]["elasticPolicy"] and "standalone" not in obj["spec"]["elasticPolicy"]


@needs_crd
def test_golden_sweep():
    plan = plan_of("sweep.yaml")
    text = plan.render()
    check_golden("k8s_sweep.yaml", text)
    objs = common_checks(text, plan)
    assert [o["metadata"]["name"] for o in objs] == [f"{CTX_ID}-{i}" for i in range(4)]
    assert {o["metadata"]["labels"]["ddpjob/sweep-id"] for o in objs} == {CTX_ID}
    assert [o["metadata"]["labels"]["ddpjob/sweep-index"] for o in objs] == ["0", "1", "2", "3"]
    cmd = container(objs[3])["command"]
    assert cmd[cmd.index("--lr") + 1] == "0.01" and cmd[cmd.index("--seed") + 1] == "2"
    assert env_of(container(objs[2]))["DDPJOB_OUTPUT_DIR"] == f"/workspace/outputs/{CTX_ID}/sweep-2"


@needs_crd
def test_golden_hostile_strings():
    plan = plan_of(base={
        "name": "demo", "image": "img:1", "command": ["python", "train.py", "--note", "$(HOME) $$ ${{local_rank}}}}", "{lr}"],
        "env": {"NOTE": "$(PATH) a'b \"c\""}, "sweep": {"lr": [0.1]},
    })
    text = plan.render()
    check_golden("k8s_hostile.yaml", text)
    (obj,) = common_checks(text, plan)
    c = container(obj)
    # torchrun's $-macros are escaped, then the kubelet's $(VAR): each $ is doubled twice for arguments.
    assert c["command"][-2:] == ["$$$$(HOME) $$$$$$$$ $$$${local_rank}}", "0.1"]
    assert env_of(c)["NOTE"] == "$$(PATH) a'b \"c\""


@pytest.mark.parametrize("text,expected", [
    ("plain", "plain"), ("$(HOME)", "$$(HOME)"), ("$$", "$$$$"), ("a$b", "a$$b"), ("$", "$$"), ("", ""),
])
def test_kubelet_escape(text, expected):
    assert kubelet_escape(text) == expected


def test_torchrun_escape():
    assert torchrun_escape(["train.py", "$x"]) == ["train.py", "$$x"]
    assert torchrun_escape(["--no-python", "/bin/$weird", "$x"]) == ["--no-python", "/bin/$weird", "$$x"]


@pytest.mark.parametrize("status,state,msg", [
    (None, JobState.PENDING, NOT_RECONCILED),
    ({}, JobState.PENDING, NOT_RECONCILED),
    ({"conditions": [{"type": "Created", "status": "True", "message": "created"}]}, JobState.PENDING, "created"),
    ({"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True", "message": "run"}]},
     JobState.RUNNING, "run"),
    ({"conditions": [{"type": "Created", "status": "True"}, {"type": "Restarting", "status": "True", "message": "r"}]},
     JobState.RUNNING, "r"),
    ({"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True", "message": "ok"}]},
     JobState.SUCCEEDED, "ok"),
    ({"conditions": [{"type": "Succeeded", "status": "True"}, {"type": "Failed", "status": "True", "message": "bad"}]},
     JobState.FAILED, "bad"),
    ({"conditions": [{"type": "Running", "status": "True"}, {"type": "Suspended", "status": "True", "message": "s"}]},
     JobState.PENDING, "s"),
    ({"conditions": [{"type": "Created", "status": "True"}, {"type": "Hibernating", "status": "True", "message": "?"}]},
     JobState.UNKNOWN, "?"),
])
def test_condition_table(status, state, msg):
    assert condition_state(status) == (state, msg)


def test_condition_table_covers_operator_conditions():
    assert set(PYTORCHJOB_CONDITIONS) == {"Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"}
    assert replica_summary({"replicaStatuses": {"Worker": {"active": 2}, "Master": {"succeeded": 1}}}) == \
        "Master: 1 succeeded; Worker: 2 active"


@pytest.mark.parametrize("path,field", [
    (("metadata", "name"), ("name",)),
    (("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0, "env", 3, "name"), ("env",)),
    (("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0, "resources", "limits"), ("resources",)),
    (("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "volumes", 1), ("k8s", "volumes")),
    (("spec", "pytorchReplicaSpecs", "Master", "replicas"), ("nodes",)),
    (("spec", "elasticPolicy", "minReplicas"), ("k8s", "elastic")),
    (("spec", "somethingNew"), ("k8s",)),
])
def test_manifest_path_maps_to_spec_field(path, field):
    assert spec_field(path) == field


# --------------------------------------------------------------------------- refused before any request

@pytest.mark.parametrize("overrides,field,words", [
    (["k8s.namspace=ml"], "k8s.namspace", "did you mean 'namespace'"),
    (["k8s.cpu=0.5"], "k8s.cpu", "float"),
    (["k8s.cpu=half"], "k8s.cpu", "not a CPU quantity"),
    # Issue 45, item 10: a quantity of 2,000 digits was rendered as a request of that many cores.
    ([f"k8s.cpu={'1' * 2000}"], "k8s.cpu", "more cores than one node has (at most 4096)"),
    ([f"k8s.cpu='{'1' * 2000}m'"], "k8s.cpu", "(2001 characters) is more cores"),
    (["k8s.cpu=4097"], "k8s.cpu", "more cores"),
    (["k8s.cpu='4097000m'"], "k8s.cpu", "more cores"),
    (["resources.cpus=0.5"], "resources.cpus", "integer"),
    (["env.TOKEN=x", "k8s.env_refs.TOKEN={secret: s, key: k}"], "k8s.env_refs.TOKEN", "duplicate env name"),
    (["k8s.elastic={min_nodes: 1, max_nodes: 4, standalone: true}"], "k8s.elastic", "standalone"),
    (["k8s.elastic={min_nodes: 3, max_nodes: 4}"], "nodes", "outside"),
    (["k8s.labels={ddpjob/job-id: x}"], "k8s.labels", "set by ddpjob"),
    (["k8s.volumes=[{name: a, mount_path: /a}]"], "k8s.volumes[0]", "exactly one source"),
    (["image=null"], "image", "needs an image"),
])
def test_spec_problems_are_located(tmp_path, overrides, field, words):
    spec = tmp_path / "job.yaml"
    spec.write_text((REPO / "jobs" / "quickstart.yaml").read_text())
    with pytest.raises(SpecError) as err:
        loaded = load_spec(spec, overrides=overrides)
        KubernetesTarget().plan(loaded, ctx("quickstart-abcde"))
    text = err.value.render()
    assert f": {field}: " in text and words in text, text
    assert "nothing was submitted" in text


def test_k8s_field_errors_name_file_and_line(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nk8s:\n  cpu: 0.5\n  namspace: ml\n"
                    "  env_refs:\n    RANK: {secret: s, key: k}\n")
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    text = err.value.render()
    assert f"{spec}:5:3: k8s.cpu: 0.5 is a float" in text, text
    assert f"{spec}:6:3: k8s.namspace: unknown field 'namspace'" in text, text
    assert f"{spec}:8:5: k8s.env_refs.RANK" in text, text


def test_schema_problem_maps_to_spec_line(tmp_path):
    # With name <= 40 the registry's `<name>-<5>` ids always fit; the check guards other id shapes.
    spec = tmp_path / "job.yaml"
    spec.write_text("name: " + "a" * 40 + "\nimage: img:1\ncommand: [python, t.py, '{x}']\nnodes: 1000\n"
                    "sweep:\n  x: [" + ", ".join(str(i) for i in range(12)) + "]\n")
    with pytest.raises(SpecError) as err:
        KubernetesTarget().plan(load_spec(spec), ctx("a" * 40 + "-abcdefghijk"))
    text = err.value.render()
    assert f"{spec}:1:1: name: too long for Kubernetes" in text and "-11-worker-998" in text, text


def test_operator_env_is_refused_at_its_line(tmp_path):
    """The operator appends PYTHONUNBUFFERED=1 (and MASTER_*, RANK, PET_*) after the user's env:
    on k8s a user's value would be silently replaced, so the spec is refused where it says it."""
    spec = tmp_path / "job.yaml"
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nenv:\n  KEEP: '1'\n  PYTHONUNBUFFERED: '0'\n")
    with pytest.raises(SpecError) as err:
        KubernetesTarget().plan(load_spec(spec), ctx("demo-abcde"))
    text = err.value.render()
    assert f"{spec}:6:3: env.PYTHONUNBUFFERED: PYTHONUNBUFFERED is set by the training operator" in text, text
    assert "1 problem found" in text
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nk8s:\n  env_refs:\n"
                    "    PYTHONUNBUFFERED: {config_map: c, key: k}\n")
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert f"{spec}:6:5: k8s.env_refs.PYTHONUNBUFFERED" in err.value.render() and "training operator" in err.value.render()
    # Without it, nothing of the operator's is emitted (the operator adds PYTHONUNBUFFERED=1 itself).
    spec.write_text("name: demo\nimage: img:1\ncommand: [python, t.py]\nenv:\n  KEEP: '1'\n")
    text = KubernetesTarget().plan(load_spec(spec), ctx("demo-abcde")).render()
    assert "KEEP" in text and "PYTHONUNBUFFERED" not in text


def test_render_and_help_do_not_import_kubernetes(tmp_path):
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['ddpjob'] + sys.argv[1:]\n"
        "try:\n"
        "    from launcher.cli.main import cli\n"
        "    cli(prog_name='ddpjob')\n"
        "except SystemExit as e:\n"
        "    heavy = sorted(m for m in ('kubernetes', 'torch', 'submitit') if m in sys.modules)\n"
        "    sys.stderr.write('HEAVY=' + ','.join(heavy) + ' CODE=' + str(e.code) + '\\n')\n"
    )
    for args in (["--help"], ["render", str(REPO / "jobs" / "cifar.yaml"), "--target", "k8s"],
                 ["validate", str(REPO / "jobs" / "sweep.yaml"), "--target", "k8s"]):
        proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)
        assert "HEAVY= CODE=0" in proc.stderr, (args, proc.stderr[-2000:])


@pytest.mark.parametrize("value", ["a\x85b", "x\u2028y", "long words " * 500, "é" * 5000 + " z", " lead", "#", "- x"])
def test_the_plan_text_reads_back_as_the_objects_sent(value):
    """What render prints is the object submit sends, even for values YAML finds awkward (the pure-Python
    emitter turned NEL, U+0085, into a line break)."""
    from launcher.targets.k8s.payload import to_yaml

    obj = {"metadata": {"name": "x", "annotations": {"note": value}}, "spec": {"args": [value, {"k": value}]}}
    assert yaml.safe_load(to_yaml(obj)) == obj
