"""The Kubernetes target end to end: the real kubernetes client over HTTP against the loopback API
server (tests/k8s/fake_apiserver.py), which plays the training operator and runs each pod's command
as a local process under the operator's environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.main import cli as ddpjob_cli

REPO = Path(__file__).resolve().parents[2]


def ddpjob(*args: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess[str]:
    """The real command line in a subprocess (what users run); KUBECONFIG/DDPJOB_HOME come from the fixtures."""
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ddpjob {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc

DDP_SCRIPT = """\
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"hello rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
      f"node_rank={os.environ.get('PET_NODE_RANK')} args={sys.argv[1:]!r} secret={os.environ.get('TOKEN')!r}", flush=True)
for i in range(3):
    print(f"line {i} from rank {dist.get_rank()}", flush=True)
dist.destroy_process_group()
"""


def run(*args: str) -> tuple[int, str]:
    """The CLI in-process (fast: for error paths and queries)."""
    result = CliRunner().invoke(ddpjob_cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def job_id_of(output: str) -> str:
    m = re.search(r"Submitted (\S+) to k8s", output)
    assert m, output
    return m.group(1)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "ddp_hello.py"
    path.write_text(DDP_SCRIPT)
    return path


def test_two_node_job_runs_to_success_and_logs_survive_the_pods(k8s_api, script, tmp_path, monkeypatch):
    k8s_api.server.add_secret("default", "creds", {"token": "s3cr3t"})
    k8s_api.server.pod_start_delay = 2.0  # the follower first sees Pending pods, then picks them up
    proc = ddpjob("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--nodes", "2",
                  "--procs-per-node", "2",
                  "--set", f'command=[python, "{script}", "$(HOME)", "a$$b", "$local_rank", "{{{{x}}}}"]',
                  "--set", "k8s.env_refs.TOKEN={secret: creds, key: token}", "-f", timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "SUCCEEDED" in proc.stderr
    job_id = job_id_of(out)
    # Both replicas ran under the operator's rendezvous, each line prefixed by replica and rank.
    args = repr(["$(HOME)", "a$$b", "$local_rank", "{x}"])  # user strings reach the process literally
    # 2 nodes x 2 processes: worker-0's local rank 1 is global rank 3.
    for replica, rank, node in (("master-0", 0, 0), ("master-0", 1, 0), ("worker-0", 2, 1), ("worker-0", 3, 1)):
        line = f"[{replica} rank{rank}] hello rank={rank} world=4 sum=10 node_rank={node} args={args} secret='s3cr3t'"
        assert line in out, out

    # What was sent: the cluster's CRD read, a strict dry run, then one strict create; no rendezvous
    # variables or secret values of ours in it.
    assert k8s_api.server.requests[0]["path"] == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"
    dry, create = [r for r in k8s_api.server.requests if r["method"] == "POST"]
    assert dry["query"] == {"dryRun": "All", "fieldValidation": "Strict"} and dry["body"] == create["body"]
    assert create["query"].get("fieldValidation") == "Strict" and "dryRun" not in create["query"]
    body = json.dumps(create["body"])
    assert "s3cr3t" not in body and '"MASTER_ADDR"' not in body and '"PET_' not in body
    pods = k8s_api.server.pods_of(job_id)
    assert sorted(p.name for p in pods if p.name.endswith("master-0")) == [f"{job_id}-master-0"]

    lines = set(ddpjob("logs", job_id, check=True).stdout.splitlines())
    expected = {f"[{'master' if r < 2 else 'worker'}-0 rank{r}] line {i} from rank {r}" for i in range(3) for r in range(4)}
    assert expected <= lines

    # The pods (and the server's copy of their logs) go away; ddpjob kept every line.
    k8s_api.server.delete_pods(job_id)
    assert k8s_api.server.pods_of(job_id) == []
    after = set(ddpjob("logs", job_id, check=True).stdout.splitlines())
    assert expected <= after and any(ln.startswith("[worker-0 rank3] hello") for ln in after)
    followed = ddpjob("logs", job_id, "-f", timeout=60)  # a finished job: saved lines, then it returns
    assert followed.returncode == 0 and expected <= set(followed.stdout.splitlines()), followed.stderr
    assert set(ddpjob("logs", job_id, "--rank", "3", check=True).stdout.splitlines()) == \
        {ln for ln in after if ln.startswith("[worker-0 rank3]")}
    (last,) = run("logs", job_id, "--node", "1", "--tail", "1")[1].splitlines()  # the agent may have the last word
    assert last.startswith("[worker-0") and last in after, last

    # The cluster is out of reach: the saved lines are still served.
    cfg = json.loads(Path(k8s_api.kubeconfig).read_text())
    cfg["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"
    (tmp_path / "dead").write_text(json.dumps(cfg))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "dead"))
    saved = run("logs", job_id)[1].splitlines()
    assert saved[0].startswith("[ddpjob] showing saved logs only: cannot reach the Kubernetes API server") and expected <= set(saved)
    monkeypatch.setenv("KUBECONFIG", str(k8s_api.kubeconfig))

    code, text = run("status", job_id)
    assert code == 0 and "state:    SUCCEEDED" in text and f"pytorchjobs: {job_id}" in text, text


def test_real_quickstart_trainer(k8s_api):
    """The repository's quickstart job, unchanged, with the real trainer in two pods."""
    proc = ddpjob("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--nodes", "2", "-f",
                  timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = job_id_of(proc.stdout)
    logs = ddpjob("logs", job_id, check=True).stdout
    assert re.search(r"^\[master-0 rank0\] .*done: .* world size 2", logs, re.M), logs[-3000:]
    assert re.search(r"^\[worker-0 rank1\] rank 1/2", logs, re.M), logs[-3000:]
    # Progress from the pods' logs (issue 25 item 8): the trainer's DDPJOB_PROGRESS lines, hidden from logs
    progress = json.loads(ddpjob("status", job_id, "-o", "json", check=True).stdout)["progress"]
    assert progress["step"] == progress["total_steps"] > 0 and "loss" in progress, progress
    assert "DDPJOB_PROGRESS" not in logs and "DDPJOB_PROGRESS {" in ddpjob("logs", job_id, "--verbose").stdout
    k8s_api.server.delete_pods(job_id)
    assert ddpjob("logs", job_id, check=True).stdout.splitlines() == logs.splitlines()


def test_sweep_is_one_pytorchjob_per_element(k8s_api):
    code, out = run("submit", str(REPO / "jobs" / "sweep.yaml"), "--target", "k8s", "--nodes", "1",
                    "--set", "command=[python, -c, 'print(\"lr={lr} seed={seed}\")']",
                    "--set", "sweep={lr: [0.1, 0.01], seed: [7]}")
    assert code == 0, out
    job_id = job_id_of(out)
    names = [f"{job_id}-0", f"{job_id}-1"]
    for name in names:
        obj = k8s_api.server.job(name)
        assert obj["metadata"]["labels"]["ddpjob/sweep-id"] == job_id
    assert sorted(j["metadata"]["name"] for j in k8s_api.server.jobs.values()) == names
    code, out = run("wait", job_id, "--timeout", "240")
    assert code == 0 and "SUCCEEDED" in out, out
    code, out = run("status", job_id)
    assert f"task 0 [{names[0]}]: SUCCEEDED (lr=0.1 seed=7)" in out and f"task 1 [{names[1]}]: SUCCEEDED (lr=0.01 seed=7)" in out, out
    code, out = run("list")
    assert re.search(rf"^{job_id}\s+k8s\s+SUCCEEDED", out, re.M), out
    code, out = run("logs", job_id, "--task", "1")
    assert "[task1 master-0 rank0] lr=0.01 seed=7" in out and "task0" not in out, out


def test_restart_keeps_previous_logs_and_cancel_is_idempotent(k8s_api, tmp_path):
    marker = tmp_path / "failed-once"
    prog = (f"import os, sys, time; p = {str(marker)!r}; first = not os.path.exists(p); open(p, 'a').close(); "
            "print('attempt', 'first' if first else 'second', flush=True); sys.exit(3) if first else None; "
            "print('now waiting', flush=True); time.sleep(120)")
    code, out = run("submit", str(REPO / "jobs" / "linreg.yaml"), "--target", "k8s", "--procs-per-node", "1",
                    "--set", f"command=[python, -c, {json.dumps(prog)}]", "--set", "max_restarts=0")
    assert code == 0, out
    job_id = job_id_of(out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        code, out = run("logs", job_id)
        if "now waiting" in out:
            break
        time.sleep(0.5)
    assert "[master-0] attempt first" in out or "[master-0 rank0] attempt first" in out, out
    assert "attempt second" in out and "now waiting" in out, out
    # The failed first run's torchrun report is in the pod's log, shown only with --verbose.
    assert "Root Cause (first observed failure)" not in out and "torchrun stopped: ChildFailedError" in out, out
    assert "Root Cause (first observed failure)" in run("logs", job_id, "--verbose")[1]
    code, status = run("status", job_id)
    assert "RUNNING" in status and "restarts=1" in status, status
    k8s_api.server.requests.clear()
    code, out = run("cancel", job_id)
    assert code == 0 and "CANCELLED" in out, out
    (delete,) = [r for r in k8s_api.server.requests if r["method"] == "DELETE"]
    assert delete["body"].get("propagationPolicy") == "Foreground"
    assert k8s_api.server.job(job_id) is None
    # Deleting again (the target itself, past the registry's terminal check): 404 means done.
    from launcher.service.registry import Registry
    from launcher.targets.k8s.target import KubernetesTarget

    target = KubernetesTarget()
    target.cancel(target.load_handle(Registry().get(job_id).handle))
    code, out = run("logs", job_id)  # pods gone with the job: both runs still shown
    assert "attempt first" in out and "attempt second" in out, out


def test_elastic_job_rendezvous_through_the_operator_env(k8s_api, script):
    proc = ddpjob("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--nodes", "2",
                  "--set", "k8s.elastic={min_nodes: 2, max_nodes: 2}", "--set", f"command=[python, {script}]",
                  "-f", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = job_id_of(proc.stdout)
    env = k8s_api.server.pods_of(job_id)[0].injected_env
    assert env["PET_NNODES"] == "2:2" and env["PET_RDZV_BACKEND"] == "c10d"
    # Ranks come from the c10d rendezvous, not the replica index: lines keep torchrun's prefix.
    hello = [ln for ln in proc.stdout.splitlines() if "hello rank=" in ln]
    assert len(hello) == 2 and all(re.match(r"^\[(master|worker)-0\] \[default0\]:hello", ln) for ln in hello), hello
    code, out = run("logs", job_id, "--rank", "0")
    assert code == 3 and "--rank is not available for elastic jobs" in out, out


def test_follow_across_an_in_place_restart(k8s_api, tmp_path):
    marker = tmp_path / "failed-once"
    prog = (f"import os, sys; p = {str(marker)!r}; first = not os.path.exists(p); open(p, 'a').close(); "
            "print('attempt', 'first' if first else 'second', flush=True); sys.exit(3 if first else 0)")
    proc = ddpjob("submit", str(REPO / "jobs" / "linreg.yaml"), "--target", "k8s", "--procs-per-node", "1",
                  "--set", f"command=[python, -c, {json.dumps(prog)}]", "--set", "max_restarts=0", "-f", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    first, second = out.find("attempt first"), out.find("attempt second")
    assert 0 <= first < second, out  # the failed run's lines, then the restarted run's
    job_id = job_id_of(out)
    pod_dir = Path(os.environ["DDPJOB_HOME"]) / "runs" / job_id / "pods" / f"{job_id}-master-0"
    assert sorted(p.name[-8:] for p in pod_dir.glob("*.log")) == ["r000.log", "r001.log"]


def test_pending_pods_show_scheduling_events(k8s_api):
    k8s_api.server.pod_start_delay = 600
    k8s_api.server.unschedulable_message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s")
    job_id = job_id_of(out)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, status = run("status", job_id)
        if "FailedScheduling" in status:
            break
        time.sleep(0.3)
    assert "PENDING" in status and "Pending: FailedScheduling: 0/3 nodes are available" in status, status
    k8s_api.server.requests.clear()
    code, out = run("list")  # batched: one list call for the job, no per-pod queries
    assert code == 0 and re.search(rf"^{job_id}\s+k8s\s+PENDING", out, re.M), out
    assert [r["path"] for r in k8s_api.server.requests] == ["/apis/kubeflow.org/v1/namespaces/default/pytorchjobs"]
    code, out = run("logs", job_id)  # nothing has started: no lines, no error
    assert code == 0 and out == "", out
    assert run("cancel", job_id)[0] == 0


def test_server_dry_run_sends_dry_run_all(k8s_api):
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--dry-run=server")
    assert code == 0, out
    assert "kind: PyTorchJob" in out and "server dry run (dryRun=All" in out and "1 PyTorchJob(s) accepted" in out
    read, create = k8s_api.server.requests  # the cluster's CRD first (the plan is checked against it)
    assert read["method"] == "GET" and read["path"].endswith("/customresourcedefinitions/pytorchjobs.kubeflow.org")
    assert create["query"] == {"dryRun": "All", "fieldValidation": "Strict"}
    assert k8s_api.server.jobs == {}


# --------------------------------------------------------------------------- API errors

@pytest.mark.parametrize("status,exit_code,words", [
    (403, 5, ["permission denied (403)", "k8s/rbac.yaml", "cannot create resource"]),
    (409, 7, ["already exists in namespace 'default' (409)", "kubectl delete pytorchjob"]),
    (422, 8, ["rejected PyTorchJob", "(422 ", "is invalid: spec: Invalid value"]),
])
def test_api_errors_have_their_own_message(k8s_api, status, exit_code, words):
    k8s_api.server.fail_next("POST", r"/pytorchjobs$", status)
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s")
    assert code == exit_code, out
    assert all(w in out for w in words), out
    assert "Traceback" not in out


@pytest.mark.parametrize("dry_run", [[], ["--dry-run=server"]])
def test_missing_crd_says_how_to_install_the_operator(k8s_api, dry_run):
    """The cluster has no pytorchjobs.kubeflow.org CRD: exit 6 before anything is created or recorded."""
    k8s_api.server.crd_installed = False
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *dry_run)
    assert code == 6 and "training operator is not installed" in out, out
    assert 'kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"' in out
    assert "Traceback" not in out
    assert [r["path"] for r in k8s_api.server.requests] == [
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"]
    assert k8s_api.server.jobs == {} and "no jobs yet" in run("list")[1]


def test_missing_kubeconfig(monkeypatch, tmp_path):
    missing = tmp_path / "no-such-kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s")
    assert code == 3 and f"no kubeconfig found (tried {missing})" in out and "Traceback" not in out, out
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--set", "k8s.context=nope")
    assert code == 3 and "no kubeconfig found" in out, out


def test_unknown_context_and_unreachable_server(k8s_api, tmp_path, monkeypatch):
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--set", "k8s.context=prod")
    assert code == 3 and "context 'prod' is not in kubeconfig" in out and "ddpjob-test" in out, out
    cfg = json.loads(Path(k8s_api.kubeconfig).read_text())
    cfg["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # nothing listens on the discard port
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(json.dumps(cfg))
    monkeypatch.setenv("KUBECONFIG", str(dead))
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s")
    assert code == 3 and "cannot reach the Kubernetes API server http://127.0.0.1:9" in out and str(dead) in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("args,words", [
    (["--name", "a" * 41], "name: must be a DNS-1035 label of at most 40"),
    (["--set", "k8s.namspace=ml"], "k8s.namspace: unknown field"),
    (["--set", "env.TOKEN=x", "--set", "k8s.env_refs.TOKEN={secret: s, key: k}"], "duplicate env name"),
    (["--set", "k8s.cpu=0.5"], "k8s.cpu: 0.5 is a float"),
])
def test_bad_specs_send_nothing(k8s_api, args, words):
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", *args)
    assert code == 2 and words in out, out
    assert [r["method"] for r in k8s_api.server.requests] in ([], ["GET"])  # at most the CRD was read


def test_a_pytorchjob_notifies_once_when_it_ends(k8s_api, tmp_path):
    """The watcher asks the API server until the PyTorchJob has ended, then notifies (issue 25 item 7)."""
    from tests.foundation.test_found_notify import Hook, check_sent_once, notify_args

    hook = Hook()
    try:
        args, notes = notify_args(tmp_path, hook)
        code, out = run("submit", str(REPO / "jobs" / "linreg.yaml"), "--target", "k8s", "--procs-per-node", "1",
                        "--set", "command=[python, -c, print(1)]", *args)
        assert code == 0, out
        check_sent_once(ddpjob, job_id_of(out), hook, notes, "SUCCEEDED", Path(os.environ["DDPJOB_HOME"]))
    finally:
        hook.server.shutdown()


def test_a_starting_job_shows_its_pods_phases_and_events(k8s_api):
    """What a terminal shows while pods wait (issue 25 item 1): their phase and the scheduler's event."""
    from launcher.service.jobs import Jobs
    from launcher.service.stages import live_line

    k8s_api.server.pod_start_delay = 600
    k8s_api.server.unschedulable_message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s")
    assert code == 0, out
    job_id = job_id_of(out)
    try:
        line = ""
        for _ in range(100):
            line = live_line(Jobs(), job_id)[1]
            if "FailedScheduling" in line:
                break
            time.sleep(0.3)
        assert line.startswith("PENDING: ") and "Pending: FailedScheduling: 0/3 nodes are available" in line, line
    finally:
        run("cancel", job_id)


def test_defaults_from_a_project_file_reach_the_created_pytorchjob(k8s_api, tmp_path, monkeypatch):
    """A project file's target and k8s settings fill what the spec leaves out, on the object the
    API server receives (issue 25 item 6); the spec's own values and the flags win."""
    (tmp_path / ".ddpjob.yaml").write_text("target: k8s\nk8s: {queue: team-q}\nenv: {FROM_PROJECT: p}\n"
                                           "max_restarts: 2\n")
    (tmp_path / "job.yaml").write_text("name: cfg\nimage: img:1\ncommand: [python, -c, print(1)]\nmax_restarts: 1\n")
    monkeypatch.setenv("DDPJOB_CONFIG", str(tmp_path / "user.yaml"))
    (tmp_path / "user.yaml").write_text("k8s: {queue: user-q, labels: {team: ml}}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher", "submit", "job.yaml", "--env", "FROM_FLAG=f"], cwd=tmp_path,
                          env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    obj = k8s_api.server.job(job_id_of(proc.stdout))  # no --target: the project file's
    assert obj is not None and obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    assert obj["metadata"]["labels"]["team"] == "ml"  # from the user config: nothing higher sets labels
    env = {e["name"]: e.get("value") for e in obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["FROM_PROJECT"] == "p" and env["FROM_FLAG"] == "f"
    assert '"--max-restarts", "1"' in json.dumps(obj)  # the spec's own value over the project file's 2
