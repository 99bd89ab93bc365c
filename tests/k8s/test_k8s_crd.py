"""The PyTorchJob CRD as an input of the plan: the cluster's own on submit (read with the real
kubernetes client from the loopback API server), ``$DDPJOB_PYTORCHJOB_CRD`` or the cache offline,
and what ``validate``/``render`` say when there is none. Also the server's dry run before create
(a 422 pointed at the spec's lines) and the in-cluster configuration of a pod's service account.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from fake_apiserver import STAND_IN_CRD, start, upstream_schema
from testkit import needs_crd

from launcher.cli.main import cli as ddpjob_cli
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.k8s.target import KubernetesTarget
from launcher.targets.k8s.validation import crd as crd_mod
from launcher.targets.k8s.validation.crd import CrdInput
from launcher.targets.k8s.validation.schema import strict_schema, version_schema

REPO = Path(__file__).resolve().parents[2]
CRD_GET = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"
PRESERVE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
# The PyTorchJob of an operator older than v1.7, which had no spec.nprocPerNode (kubeflow/trainer#1840).
OLD_OPERATOR_CRD = copy.deepcopy(STAND_IN_CRD)
OLD_OPERATOR_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {
            "runPolicy": PRESERVE, "elasticPolicy": PRESERVE,
            "pytorchReplicaSpecs": {"type": "object", "additionalProperties": PRESERVE}}},
        "status": PRESERVE,
    },
}


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(ddpjob_cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """The quickstart job at a known path (image: line 4, procs_per_node: line 10)."""
    path = tmp_path / "job.yaml"
    shutil.copy(REPO / "jobs" / "quickstart.yaml", path)
    return path


def cache_dir() -> Path:
    return Path(os.environ["DDPJOB_HOME"]) / "crds"


# --------------------------------------------------------------------------- offline

def test_without_a_crd_validate_and_render_say_the_strict_check_was_skipped(monkeypatch, spec):
    monkeypatch.setenv("DDPJOB_PYTORCHJOB_CRD", "/nonexistent")
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 0 and "strict CRD check skipped: DDPJOB_PYTORCHJOB_CRD=/nonexistent is not a file" in out, out
    assert "checks passed" not in out and "--dry-run=server" in out, out
    monkeypatch.delenv("DDPJOB_PYTORCHJOB_CRD")
    code, out = run("render", str(spec), "--target", "k8s")
    assert code == 0 and "# checked: the training operator's rules only; strict CRD check skipped: no PyTorchJob CRD here" in out
    assert "set DDPJOB_PYTORCHJOB_CRD to a copy of kubeflow.org_pytorchjobs.yaml" in out


@needs_crd
def test_with_the_crd_validate_says_the_strict_check_ran(spec):
    code, out = run("validate", str(spec), "--target", "k8s")
    crd = os.environ["DDPJOB_PYTORCHJOB_CRD"]
    assert code == 0 and f"k8s checks passed, strict CRD check ran against pytorchjobs.kubeflow.org v1 from " \
        f"$DDPJOB_PYTORCHJOB_CRD ({crd})" in out, out


def test_the_crd_is_an_input_of_the_plan_not_a_file_it_reads(monkeypatch, spec):
    """Same spec, same environment: the plan's checks follow ``ctx.inputs`` alone."""
    loaded = load_spec(spec, overrides=["k8s.rdma=true"])
    monkeypatch.setenv("DDPJOB_PYTORCHJOB_CRD", "/nonexistent")
    # A CRD whose runPolicy knows no backoffLimit: the plan is refused with it, whatever the variable says.
    narrow = copy.deepcopy(OLD_OPERATOR_CRD)
    narrow["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["nprocPerNode"] = {"type": "string"}
    narrow["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["runPolicy"] = {
        "type": "object", "properties": {"cleanPodPolicy": {"type": "string"}}}
    given = CrdInput(strict_schema(version_schema(narrow, "v1")), "x" * 64, "a test")
    target = KubernetesTarget()
    ctx = PlanContext(job_id="quickstart-abcde", run_dir="/tmp/r", inputs=given)
    with pytest.raises(Exception) as err:
        target.plan(loaded, ctx)
    assert "k8s.backoff_limit: the PyTorchJob's spec.runPolicy.backoffLimit: unknown field 'backoffLimit'" in str(err.value)
    permissive = CrdInput(strict_schema(version_schema(STAND_IN_CRD, "v1")), "y" * 64, "a test")
    plan = target.plan(loaded, PlanContext(job_id="quickstart-abcde", run_dir="/tmp/r", inputs=permissive))
    assert "# checked: PyTorchJob CRD schema (strict)" in plan.render()
    assert plan.payload.checks == "k8s checks passed, strict CRD check ran against pytorchjobs.kubeflow.org v1 from a test"
    plan = target.plan(loaded, PlanContext(job_id="quickstart-abcde", run_dir="/tmp/r"))
    assert "strict CRD check skipped: no CRD was given to the plan" in plan.render()


def test_a_crd_file_is_parsed_once_and_cached_by_content(tmp_path, monkeypatch, spec):
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(OLD_OPERATOR_CRD))
    monkeypatch.setenv("DDPJOB_PYTORCHJOB_CRD", str(path))
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 2 and f"{spec}:10:1: procs_per_node: the PyTorchJob's spec.nprocPerNode: unknown field" in out, out
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    entry_path = cache_dir() / "files" / f"{sha[:32]}.json"
    entry = json.loads(entry_path.read_text())
    assert entry["sha256"] == sha and entry["schema"] == version_schema(OLD_OPERATOR_CRD, "v1")
    # The next process takes the parsed schema from the cache, found by the file's content hash.
    entry["schema"] = version_schema(STAND_IN_CRD, "v1")
    entry_path.write_text(json.dumps(entry))
    crd_mod._STRICT.clear()
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 0 and "strict CRD check ran" in out, out
    path.write_text(path.read_text() + "# edited\n")  # other content: parsed again
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 2 and "unknown field" in out, out


def test_a_file_that_is_not_the_crd_is_a_clear_error(tmp_path, monkeypatch, spec):
    path = tmp_path / "crd.yaml"
    path.write_text("kind: ConfigMap\nmetadata: {name: other}\n")
    monkeypatch.setenv("DDPJOB_PYTORCHJOB_CRD", str(path))
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 3 and f"DDPJOB_PYTORCHJOB_CRD={path} is not the PyTorchJob CRD" in out and "Traceback" not in out, out


# --------------------------------------------------------------------------- the cluster's CRD

def test_submit_checks_against_the_clusters_crd_before_create_and_caches_it(k8s_api, monkeypatch, spec):
    """No local copy: the CRD comes from the API server, refuses the job before any create, and
    is what offline checks use afterwards."""
    monkeypatch.delenv("DDPJOB_PYTORCHJOB_CRD", raising=False)
    k8s_api.server.crd = copy.deepcopy(OLD_OPERATOR_CRD)
    code, out = run("submit", str(spec), "--target", "k8s")
    assert code == 2, out
    assert f"{spec}:10:1: procs_per_node: the PyTorchJob's spec.nprocPerNode: unknown field 'nprocPerNode'" in out, out
    assert [(r["method"], r["path"]) for r in k8s_api.server.requests] == [("GET", CRD_GET)]
    assert "no jobs yet" in run("list")[1]
    (cached,) = cache_dir().glob("pytorchjobs.kubeflow.org_v1_*.json")
    assert json.loads(cached.read_text())["source"] == f"the cluster {k8s_api.url} (context ddpjob-test)"
    # Offline, the cached CRD of the cluster is the strict check.
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 2 and f"{spec}:10:1: procs_per_node:" in out, out
    # The operator is upgraded: the next submit reads the new CRD, and the cache follows it.
    k8s_api.server.crd = copy.deepcopy(STAND_IN_CRD)
    code, out = run("submit", str(spec), "--target", "k8s", "--set", "command=[python, -c, 'print(1)']")
    assert code == 0 and "Submitted" in out, out
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 0 and f"strict CRD check ran against pytorchjobs.kubeflow.org v1 from the CRD cached from " \
        f"the cluster {k8s_api.url}" in out, out


@needs_crd
def test_the_upstream_crd_from_the_cluster_is_strict(k8s_api, monkeypatch, spec):
    assert strict_schema(version_schema(k8s_api.server.crd, "v1")) == upstream_schema()  # the loopback holds it
    monkeypatch.delenv("DDPJOB_PYTORCHJOB_CRD")
    code, out = run("submit", str(spec), "--target", "k8s", "--dry-run=server", "--set", "k8s.backoff_limit=2147483648")
    assert code == 2 and "k8s.backoff_limit: the PyTorchJob's spec.runPolicy.backoffLimit: 2147483648 is out of range for int32" in out, out
    assert [r["method"] for r in k8s_api.server.requests] == ["GET"]


def test_an_unreadable_crd_falls_back_to_the_local_copy_and_says_so(k8s_api, monkeypatch, spec):
    """A namespaced Role cannot read cluster-scoped CRDs (403): the offline copy is used, the server still checks."""
    monkeypatch.delenv("DDPJOB_PYTORCHJOB_CRD", raising=False)
    k8s_api.server.fail_next("GET", "customresourcedefinitions", 403)
    code, out = run("submit", str(spec), "--target", "k8s", "--dry-run=server")
    assert code == 0, out
    assert "strict CRD check skipped: no PyTorchJob CRD here (DDPJOB_PYTORCHJOB_CRD unset, no cluster's CRD cached) " \
        "(the cluster's CRD could not be read: 403 reading customresourcedefinitions/pytorchjobs.kubeflow.org" in out, out
    assert "1 PyTorchJob(s) accepted" in out


# --------------------------------------------------------------------------- the server's dry run

IMAGE_FIELD = "spec.pytorchReplicaSpecs.{}.template.spec.containers[0].image"
POLICY = "Invalid value: \"ghcr.io/ddpjob/train:0.1.0\": images must come from registry.example.com (admission policy)"


@pytest.mark.parametrize("extra,where", [([], "{spec}:4:1"), (["--set", "image=ghcr.io/x:1"], "--set image=ghcr.io/x:1")])
def test_a_422_from_the_dry_run_points_at_the_spec(k8s_api, spec, extra, where):
    causes = [{"field": IMAGE_FIELD.format(r), "message": POLICY} for r in ("Master", "Worker")]
    k8s_api.server.fail_next("POST", r"/pytorchjobs$", 422, causes=causes)
    code, out = run("submit", str(spec), "--target", "k8s", *extra)
    assert code == 8, out
    assert "(422 Unprocessable Entity) in a server-side dry run (dryRun=All); nothing was created" in out, out
    line = f"{where.format(spec=spec)}: image: the PyTorchJob's {IMAGE_FIELD.format('Master')}: {POLICY}"
    assert line in out, out
    assert IMAGE_FIELD.format("Worker") not in out.split("the server said:")[0]  # one problem of the spec, once
    (post,) = [r for r in k8s_api.server.requests if r["method"] == "POST"]
    assert post["query"]["dryRun"] == "All" and k8s_api.server.jobs == {}
    assert "no jobs yet" in run("list")[1] and "Traceback" not in out


def test_a_sweep_is_checked_whole_before_any_element_is_created(k8s_api):
    # The first element's dry run passes, the second's is refused: nothing may exist afterwards.
    k8s_api.server.fail_next("POST", r"/pytorchjobs$", 422, causes=[{"field": "metadata.labels", "message": "quota"}],
                             skip=1)
    code, out = run("submit", str(REPO / "jobs" / "sweep.yaml"), "--target", "k8s", "--nodes", "1",
                    "--set", "command=[python, -c, 'print({lr}, {seed})']")
    assert code == 8 and "k8s.labels: the PyTorchJob's metadata.labels: quota" in out, out
    posts = [r for r in k8s_api.server.requests if r["method"] == "POST"]
    assert len(posts) == 2 and all(r["query"].get("dryRun") == "All" for r in posts)
    assert k8s_api.server.jobs == {}


# --------------------------------------------------------------------------- in-cluster configuration

@pytest.mark.real  # starts its own API server (TLS)
def test_in_a_pod_without_kubeconfig_the_service_account_is_used(tmp_path, monkeypatch, spec):
    if shutil.which("openssl") is None and os.environ.get("CI", "").lower() != "true":
        pytest.skip("needs openssl to make the loopback server's TLS certificate")
    from launcher.targets.k8s.cluster import client

    api = start(tmp_path / "cluster", tls=True)  # in-cluster config always speaks HTTPS
    try:
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text("sa-token-123")
        (sa / "namespace").write_text("ml")
        shutil.copy(api.ca_cert, sa / "ca.crt")
        monkeypatch.setattr(client, "SERVICE_ACCOUNT_DIR", str(sa))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
        code, out = run("submit", str(spec), "--target", "k8s", "--dry-run=server")
        assert code == 3 and "no kubeconfig found" in out, out  # not in a pod: no fallback
        host, port = api.url.removeprefix("https://").split(":")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
        (sa / "token").rename(sa / "token.off")
        code, out = run("submit", str(spec), "--target", "k8s", "--dry-run=server")
        assert code == 3 and f"cannot use the pod's service account ({sa}): Service token file does not exist" in out, out
        (sa / "token.off").rename(sa / "token")
        code, out = run("submit", str(spec), "--target", "k8s", "--set", "command=[python, -c, 'print(1)']")
        assert code == 0 and "Submitted" in out, out
        assert {r["authorization"].lower() for r in api.server.requests} == {"bearer sa-token-123"}
        assert [r["path"] for r in api.server.requests if r["method"] == "POST"] == \
            ["/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs"] * 2  # the pod's namespace
        job_id = out.split()[1]
        code, out = run("wait", job_id, "--timeout", "120")
        assert code == 0 and "SUCCEEDED" in out, out
    finally:
        api.close()
