"""TrainJobs (``k8s.api: trainjob``) end to end: the real kubernetes client over HTTP against the
loopback API server playing Kubeflow Trainer v2.3 (tests/k8s/fake_trainer.py), which runs each
node's pod command as a local process under the torch plugin's PET_* environment.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from fake_trainer import COMPLETION_INDEX, JOBSET_NAME
from test_k8s_target import DDP_SCRIPT, REPO, ddpjob, job_id_of, run
from testkit import wait_for
from trainjob_kit import needs_trainjob_crd

TJ = ("--set", "k8s.api=trainjob")
CRD_GET = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainjobs.trainer.kubeflow.org"


def posts(k8s_api) -> list[dict]:
    return [r for r in k8s_api.server.requests if r["method"] == "POST" and "/trainjobs" in r["path"]]





@needs_trainjob_crd
def test_real_quickstart_trainer_on_two_nodes(k8s_api):
    """The issue's own command: the repository's quickstart, unchanged, as a TrainJob of 2 nodes."""
    proc = ddpjob("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--nodes", "2", "-f",
                  timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SUCCEEDED: jobset completed successfully" in proc.stderr
    job_id = job_id_of(proc.stdout)
    out = proc.stdout
    assert re.search(r"^\[node-0 rank0\] .*done: .* world size 2", out, re.M), out[-3000:]
    assert re.search(r"^\[node-1 rank1\] rank 1/2", out, re.M), out[-3000:]

    # The cluster's TrainJob CRD was read, then a strict dry run and a strict create of the same body.
    assert k8s_api.server.requests[0]["path"] == CRD_GET
    dry, create = posts(k8s_api)
    assert dry["query"] == {"dryRun": "All", "fieldValidation": "Strict"} and dry["body"] == create["body"]
    assert create["path"] == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
    assert '"PET_' not in json.dumps(create["body"])
    # One pod per node, as JobSet names and labels them, with what the torch plugin injects.
    pods = sorted(k8s_api.server.pods_of(job_id), key=lambda p: p.index)
    assert [re.sub(r"-[a-z0-9]{5}$", "-xxxxx", p.name) for p in pods] == [f"{job_id}-node-0-0-xxxxx", f"{job_id}-node-0-1-xxxxx"]
    for index, pod in enumerate(pods):
        assert pod.labels[JOBSET_NAME] == job_id and pod.annotations[COMPLETION_INDEX] == str(index)
        assert pod.labels["ddpjob/job-id"] == job_id  # from the runtime patch: the TrainJob's labels stay on it
        assert pod.injected_env == {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(index),
                                    "PET_MASTER_ADDR": f"{job_id}-node-0-0.{job_id}", "PET_MASTER_PORT": "29500"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in pod.container["volumeMounts"]

    logs = ddpjob("logs", job_id, check=True).stdout
    assert re.search(r"^\[node-0 rank0\] .*done: .* world size 2", logs, re.M), logs[-3000:]
    assert re.search(r"^\[node-1 rank1\] rank 1/2", logs, re.M), logs[-3000:]
    k8s_api.server.delete_pods(job_id)
    assert k8s_api.server.pods_of(job_id) == []
    assert ddpjob("logs", job_id, check=True).stdout.splitlines() == logs.splitlines()

    code, text = run("status", job_id)
    assert code == 0 and "state:    SUCCEEDED" in text and f"trainjobs: {job_id}" in text, text
    assert "node: 1 ready, 1 succeeded (jobs)" in text, text
    code, text = run("list")
    assert code == 0 and re.search(rf"^{job_id}\s+k8s\s+SUCCEEDED\s+2\s", text, re.M), text


def test_ddp_ranks_secrets_and_literal_arguments(k8s_api, tmp_path):
    script = tmp_path / "ddp_hello.py"
    script.write_text(DDP_SCRIPT)
    k8s_api.server.add_secret("default", "creds", {"token": "s3cr3t"})
    k8s_api.server.pod_start_delay = 2.0  # the follower first sees Pending pods, then picks them up
    proc = ddpjob("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--nodes", "2",
                  "--procs-per-node", "2",
                  "--set", f'command=[python, "{script}", "$(HOME)", "a$$b", "$local_rank"]',
                  "--set", "k8s.env_refs.TOKEN={secret: creds, key: token}", "-f", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = repr(["$(HOME)", "a$$b", "$local_rank"])
    for node, rank in ((0, 0), (0, 1), (1, 2), (1, 3)):
        line = f"[node-{node} rank{rank}] hello rank={rank} world=4 sum=10 node_rank={node} args={args} secret='s3cr3t'"
        assert line in proc.stdout, proc.stdout
    (create,) = [r for r in posts(k8s_api) if "dryRun" not in r["query"]]
    body = json.dumps(create["body"])
    assert "s3cr3t" not in body and '"secretKeyRef": {"name": "creds", "key": "token"}' in body
    job_id = job_id_of(proc.stdout)
    assert set(ddpjob("logs", job_id, "--rank", "3", check=True).stdout.splitlines()) == \
        {ln for ln in proc.stdout.splitlines() if ln.startswith("[node-1 rank3]")}


def test_sweep_is_one_trainjob_per_element(k8s_api):
    code, out = run("submit", str(REPO / "jobs" / "sweep.yaml"), "--target", "k8s", *TJ, "--nodes", "1",
                    "--set", "command=[python, -c, 'print(\"lr={lr} seed={seed}\")']",
                    "--set", "sweep={lr: [0.1, 0.01], seed: [7]}")
    assert code == 0, out
    job_id = job_id_of(out)
    names = [f"{job_id}-0", f"{job_id}-1"]
    assert sorted(name for _, name in k8s_api.server.trainer.jobs) == names
    for i, name in enumerate(names):
        labels = k8s_api.server.trainer.job(name)["metadata"]["labels"]
        assert labels["ddpjob/sweep-id"] == job_id and labels["ddpjob/sweep-index"] == str(i)
    code, out = run("wait", job_id, "--timeout", "240")
    assert code == 0 and "SUCCEEDED" in out, out
    code, out = run("status", job_id)
    assert f"task 0 [{names[0]}]: SUCCEEDED (lr=0.1 seed=7)" in out and f"task 1 [{names[1]}]: SUCCEEDED (lr=0.01 seed=7)" in out, out
    code, out = run("logs", job_id)
    assert "[task0 node-0 rank0] lr=0.1 seed=7" in out and "[task1 node-0 rank0] lr=0.01 seed=7" in out, out
    code, out = run("list")
    assert re.search(rf"^{job_id}\s+k8s\s+SUCCEEDED", out, re.M), out


def test_cancel_deletes_the_trainjob_and_its_pods(k8s_api):
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--nodes", "2",
                    "--set", "command=[python, -c, 'import time; print(\"up\", flush=True); time.sleep(300)']")
    assert code == 0, out
    job_id = job_id_of(out)
    wait_for(lambda: "state:    RUNNING" in run("status", job_id)[1], "RUNNING")
    assert len(k8s_api.server.pods_of(job_id)) == 2
    code, out = run("cancel", job_id)
    assert code == 0, out
    deletes = [r for r in k8s_api.server.requests if r["method"] == "DELETE"]
    assert [r["path"] for r in deletes] == [f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{job_id}"]
    assert deletes[0]["body"]["propagationPolicy"] == "Foreground"
    assert k8s_api.server.trainer.job(job_id) is None and k8s_api.server.pods_of(job_id) == []
    code, out = run("status", job_id)
    assert "CANCELLED" in out, out
    assert run("cancel", job_id)[0] == 0  # repeating it is harmless


def test_pending_reasons_and_failure(k8s_api):
    k8s_api.server.pod_start_delay = 600
    k8s_api.server.unschedulable_message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--nodes", "2")
    assert code == 0, out
    job_id = job_id_of(out)
    wait_for(lambda: "FailedScheduling" in run("status", job_id)[1], "FailedScheduling in status")
    code, out = run("status", job_id)
    assert "state:    PENDING" in out and "Pending: FailedScheduling: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in out, out

    # The JobSet cannot be built: Trainer sets no condition, only a Warning event on the TrainJob.
    k8s_api.server.trainer.creation_failure = 'runtime "torch-distributed" not found'
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--nodes", "1")
    stuck = job_id_of(out)
    wait_for(lambda: "TrainJobResourcesCreationFailed" in run("status", stuck)[1], "the Warning event")
    assert f'{stuck}: TrainJobResourcesCreationFailed: TrainJob resources reconciliation failed: runtime' in run("status", stuck)[1]
    k8s_api.server.trainer.creation_failure = None

    k8s_api.server.pod_start_delay = 0
    k8s_api.server.trainer.backoff_limit = 1
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--nodes", "1",
                    "--set", "max_restarts=0", "--set", "command=[python, -c, 'import sys; print(\"boom\"); sys.exit(3)']")
    failing = job_id_of(out)
    code, out = run("wait", failing, "--timeout", "180")
    assert code != 0 and "FAILED" in out, out
    code, out = run("status", failing)
    assert f"jobset failed due to one or more job failures (first failed job: {failing}-node-0)" in out, out
    code, out = run("logs", failing)
    assert out.count("[node-0 rank0] boom") == 2, out  # the run before the in-place restart, and the last one


@pytest.mark.parametrize("setup,extra,exit_code,words", [
    (lambda s: setattr(s.trainer, "installed", False), [], 6, ["no TrainJob API", "helm install kubeflow-trainer"]),
    (lambda s: None, ["--set", "k8s.runtime.name=torch-h100"], 8,
     ["admission webhook", "must be created before the TrainJob is created"]),
    (lambda s: s.fail_next("POST", "trainjobs", 422, causes=[{"field": "spec.trainer.numNodes", "message": "quota"}]), [], 8,
     [":9:1: nodes: the TrainJob's spec.trainer.numNodes: quota", "nothing was created"]),
])
def test_refusals_send_nothing_and_say_why(k8s_api, tmp_path, setup, extra, exit_code, words):
    spec = tmp_path / "job.yaml"
    spec.write_text((REPO / "jobs" / "quickstart.yaml").read_text())
    setup(k8s_api.server)
    proc = ddpjob("submit", str(spec), "--target", "k8s", *TJ, *extra, timeout=60)
    assert proc.returncode == exit_code, proc.stdout + proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert k8s_api.server.trainer.jobs == {}


def test_fresh_clone_without_the_crd_uses_the_stand_in(k8s_api, monkeypatch, tmp_path):
    """Offline without $DDPJOB_TRAINJOB_CRD nor a cache: structural checks only, said so; submit reads
    the cluster's CRD and caches it, so the next offline render is strict (whichever CRD it holds)."""
    monkeypatch.delenv("DDPJOB_TRAINJOB_CRD", raising=False)
    spec = tmp_path / "job.yaml"
    spec.write_text((REPO / "jobs" / "quickstart.yaml").read_text() + "k8s:\n  api: trainjob\n")
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 0 and "strict CRD check skipped: no TrainJob CRD here (DDPJOB_TRAINJOB_CRD unset" in out, out
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *TJ, "--dry-run=server")
    assert code == 0 and "1 TrainJob(s) accepted" in out, out
    assert k8s_api.server.trainer.jobs == {}
    cached = list((Path(os.environ["DDPJOB_HOME"]) / "crds").glob("trainjobs.trainer.kubeflow.org_v1alpha1_*.json"))
    assert len(cached) == 1
    code, out = run("validate", str(spec), "--target", "k8s")
    assert code == 0 and "strict CRD check ran against trainjobs.trainer.kubeflow.org v1alpha1 from the CRD cached" in out, out
