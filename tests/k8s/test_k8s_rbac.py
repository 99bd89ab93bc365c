"""k8s/rbac.yaml grants what the k8s target's requests need, for both APIs, and nothing of Secrets."""

from __future__ import annotations

from pathlib import Path

import yaml

from launcher.targets.k8s.objects.apis import APIS

RBAC = Path(__file__).resolve().parents[2] / "k8s" / "rbac.yaml"


def docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text()) if d}


def test_the_role_covers_both_apis_pods_logs_and_events():
    rules = docs()["Role"]["rules"]
    granted = {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    for api in APIS.values():  # submit, status/list, cancel
        assert {"create", "get", "list", "delete"} <= granted[(api.group, api.plural)], api.key
    assert {"get", "list"} <= granted[("", "pods")] and "get" in granted[("", "pods/log")]
    assert granted[("", "pods/proxy")] == {"get"}  # status reads the stall watch; nothing else goes through it
    assert {"get", "list"} <= granted[("", "events")]
    assert not [k for k in granted if k[1] in ("secrets", "*")]


def test_a_cluster_role_reads_exactly_the_two_crds():
    d = docs()
    (rule,) = d["ClusterRole"]["rules"]
    assert rule["apiGroups"] == ["apiextensions.k8s.io"] and rule["resources"] == ["customresourcedefinitions"]
    assert rule["verbs"] == ["get"] and set(rule["resourceNames"]) == {a.crd_name for a in APIS.values()}
    assert d["ClusterRoleBinding"]["roleRef"]["name"] == d["ClusterRole"]["metadata"]["name"]
    assert d["ClusterRoleBinding"]["subjects"] == d["RoleBinding"]["subjects"]
