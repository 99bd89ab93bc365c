"""The strict PyTorchJob validator: the upstream CRD schema plus what plain JSON Schema misses."""

from __future__ import annotations

import copy

import pytest
from testkit import needs_crd

from launcher.errors import TargetUnavailable
from launcher.errors import dotted_path as dotted
from launcher.targets.k8s.schema import default_crd_path, validate_pytorchjob


def job(workers: int = 1) -> dict:
    container = {"name": "pytorch", "image": "ghcr.io/x/train:1", "command": ["torchrun", "-m", "launcher.train"],
                 "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                 "ports": [{"name": "pytorchjob-port", "containerPort": 29500}],
                 "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}
    tmpl = {"metadata": {"labels": {"ddpjob/id": "demo-abcde"}}, "spec": {"containers": [container]}}
    specs = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(tmpl)}}
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": copy.deepcopy(tmpl)}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "demo-abcde", "labels": {"ddpjob/id": "demo-abcde"}},
            "spec": {"nprocPerNode": "1", "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                     "pytorchReplicaSpecs": specs}}


def master_container(obj: dict) -> dict:
    return obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def paths(issues) -> list[str]:
    return [dotted(i.path) for i in issues]


def test_crd_comes_only_from_the_variable(monkeypatch, tmp_path):
    """The product never looks outside its package (no ../shared): the CRD is an explicit input."""
    monkeypatch.setenv("DDPJOB_PYTORCHJOB_CRD", str(tmp_path / "crd.yaml"))
    assert default_crd_path() == tmp_path / "crd.yaml"
    monkeypatch.delenv("DDPJOB_PYTORCHJOB_CRD")
    assert default_crd_path() is None


@needs_crd
def test_valid_jobs_pass():
    assert validate_pytorchjob(job(1)) == []
    assert validate_pytorchjob(job(0)) == []


MC = "spec.pytorchReplicaSpecs.Master.template.spec.containers[0]"


@needs_crd
@pytest.mark.parametrize("mutate,path,words", [
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(restartPolcy="Never"),
     "spec.pytorchReplicaSpecs.Worker.restartPolcy", "unknown field"),
    (lambda j: master_container(j)["resources"]["limits"].update(cpu=0.5), f"{MC}.resources.limits.cpu", "quantity"),
    (lambda j: master_container(j)["env"].append({"name": "NCCL_DEBUG", "value": "INFO"}), f"{MC}.env[1]", "duplicate"),
    (lambda j: master_container(j)["ports"].append({"name": "other", "containerPort": 29500}), f"{MC}.ports[1]", "duplicate"),
    (lambda j: j["metadata"].update(name="a" * 60), "metadata.name", "too long"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "spec.pytorchReplicaSpecs.Master.replicas", "exactly 1"),
    (lambda j: master_container(j).update(name="main"), "spec.pytorchReplicaSpecs.Master.template.spec.containers", "'pytorch'"),
    (lambda j: j["spec"].update(elasticPolicy={"standalone": True, "minReplicas": 1, "maxReplicas": 2}), "spec.elasticPolicy.standalone", "breaks torchrun"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=2**31), "spec.pytorchReplicaSpecs.Worker.replicas", "int32"),
    (lambda j: j["metadata"]["labels"].update(bad="has space"), "metadata.labels.bad", "label value"),
    (lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy="Sometimes"), "spec.runPolicy.cleanPodPolicy", "not one of"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"]["Worker"]), "spec.pytorchReplicaSpecs.Chief", "unknown replica type"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].pop("Master"), "spec.pytorchReplicaSpecs", "Master"),
    (lambda j: j["metadata"].update(name="Demo_1"), "metadata.name", "DNS-1035"),
])
def test_each_rule_is_enforced_with_its_path(mutate, path, words):
    obj = job(1)
    mutate(obj)
    issues = validate_pytorchjob(obj)
    hits = [i for i in issues if dotted(i.path) == path]
    assert hits, f"nothing at {path}: {[str(i) for i in issues]}"
    assert any(words in i.message for i in hits), [str(i) for i in hits]


@needs_crd
def test_port_protocol_default_applies_to_uniqueness():
    obj = job(0)
    master_container(obj)["ports"].append({"name": "p2", "containerPort": 29500, "protocol": "TCP"})
    assert f"{MC}.ports[1]" in paths(validate_pytorchjob(obj))
    obj = job(0)
    master_container(obj)["ports"].append({"name": "p2", "containerPort": 29500, "protocol": "UDP"})
    assert validate_pytorchjob(obj) == []


def test_missing_crd_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_PYTORCHJOB_CRD", str(tmp_path / "nope.yaml"))
    with pytest.raises(TargetUnavailable, match="DDPJOB_PYTORCHJOB_CRD"):
        validate_pytorchjob(job())
