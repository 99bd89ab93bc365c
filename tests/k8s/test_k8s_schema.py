"""The PyTorchJob checks: structural (no CRD needed), and strict against the upstream CRD schema
plus what plain JSON Schema misses."""

from __future__ import annotations

import copy

import pytest
from fake_apiserver import STAND_IN_CRD, upstream_schema
from testkit import needs_crd

from launcher.core.errors import dotted_path as dotted
from launcher.targets.k8s.validation.schema import strict_schema, validate_pytorchjob, version_schema


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


@needs_crd
def test_valid_jobs_pass():
    assert validate_pytorchjob(job(1), upstream_schema()) == []
    assert validate_pytorchjob(job(0), upstream_schema()) == []


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
    issues = validate_pytorchjob(obj, upstream_schema())
    hits = [i for i in issues if dotted(i.path) == path]
    assert hits, f"nothing at {path}: {[str(i) for i in issues]}"
    assert any(words in i.message for i in hits), [str(i) for i in hits]


@needs_crd
def test_list_map_keys_that_are_lists_or_objects_are_compared_not_a_type_error():
    obj = job(0)
    ports = master_container(obj)["ports"]
    ports += [{"name": "p2", "containerPort": [29500], "protocol": {"a": 1}},
              {"name": "p3", "containerPort": [29500], "protocol": {"a": 1}}]
    issues = validate_pytorchjob(obj, upstream_schema())
    assert f"{MC}.ports[2]" in paths(issues) and f"{MC}.ports[1]" not in [
        p for p, i in zip(paths(issues), issues) if "duplicate" in i.message], [str(i) for i in issues]
    assert issues == validate_pytorchjob(obj, upstream_schema())  # one order, the same each time


@needs_crd
def test_port_protocol_default_applies_to_uniqueness():
    obj = job(0)
    master_container(obj)["ports"].append({"name": "p2", "containerPort": 29500, "protocol": "TCP"})
    assert f"{MC}.ports[1]" in paths(validate_pytorchjob(obj, upstream_schema()))
    obj = job(0)
    master_container(obj)["ports"].append({"name": "p2", "containerPort": 29500, "protocol": "UDP"})
    assert validate_pytorchjob(obj, upstream_schema()) == []


# Structural rules need no CRD: they run in a fresh clone and whenever the strict check is skipped.
@pytest.mark.parametrize("mutate,path,words", [
    (lambda j: j["metadata"].update(name="a" * 60), "metadata.name", "too long"),
    (lambda j: j["metadata"].update(name="Demo_1"), "metadata.name", "DNS-1035"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "spec.pytorchReplicaSpecs.Master.replicas", "exactly 1"),
    (lambda j: master_container(j).update(name="main"), "spec.pytorchReplicaSpecs.Master.template.spec.containers", "'pytorch'"),
    (lambda j: j["spec"].update(elasticPolicy={"standalone": True}), "spec.elasticPolicy.standalone", "breaks torchrun"),
    (lambda j: j["metadata"]["labels"].update(bad="has space"), "metadata.labels.bad", "label value"),
    (lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy="Sometimes"), "spec.runPolicy.cleanPodPolicy", "not one of"),
    # a value no rendering makes, as a hand-edited manifest may: a list where a word goes (was a TypeError)
    (lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy=["All"]), "spec.runPolicy.cleanPodPolicy", "not one of"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].pop("Master"), "spec.pytorchReplicaSpecs", "Master"),
])
def test_structural_rules_need_no_crd(mutate, path, words):
    obj = job(1)
    assert validate_pytorchjob(obj, None) == []
    mutate(obj)
    hits = [i for i in validate_pytorchjob(obj, None) if dotted(i.path) == path]
    assert any(words in i.message for i in hits), [str(i) for i in validate_pytorchjob(obj, None)]


def test_without_a_crd_unknown_fields_pass_and_with_one_they_do_not():
    """The strict layer is the CRD's: a typo passes the structural checks alone."""
    obj = job(1)
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolcy"] = "Never"
    assert validate_pytorchjob(obj, None) == []
    typed = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "pytorchReplicaSpecs": {"type": "object", "additionalProperties": {
            "type": "object", "properties": {"replicas": {"type": "integer", "format": "int32"},
                                             "restartPolicy": {"type": "string"}, "template": {"type": "object"}},
            "x-kubernetes-preserve-unknown-fields": True}}}, "x-kubernetes-preserve-unknown-fields": True}},
        "x-kubernetes-preserve-unknown-fields": True}
    assert validate_pytorchjob(obj, strict_schema(typed)) == []  # preserve-unknown-fields keeps unknown fields
    del typed["properties"]["spec"]["properties"]["pytorchReplicaSpecs"]["additionalProperties"]["x-kubernetes-preserve-unknown-fields"]
    assert paths(validate_pytorchjob(obj, strict_schema(typed))) == ["spec.pytorchReplicaSpecs.Worker.restartPolcy"]
    assert validate_pytorchjob(obj, strict_schema(version_schema(STAND_IN_CRD, "v1"))) == []
    with pytest.raises(ValueError, match="no v2 version"):
        version_schema(STAND_IN_CRD, "v2")
