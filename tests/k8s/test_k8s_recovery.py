"""A lost pod costs seconds, not the run (issue 43), on Kubernetes: the real kubernetes client against the
loopback API server (``fake_apiserver.py``), which plays the operator and recreates a deleted pod of a
PyTorchJob under its name, as the Kubeflow training operator does, and a TrainJob's under a new name
with the same completion index, as the Job controller does for an Indexed Job (``fake_trainer.py``).
Each pod has a filesystem of its own here (``own_filesystems``), as in a cluster: only the first pod
holds the trainer's checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fake_trainer import COMPLETION_INDEX
from test_k8s_target import ddpjob, job_id_of
from testkit import wait_for

TRAIN = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "2048", "--eval-size", "200", "--epochs", "2",
         "--batch-size", "32", "--lr", "0.05", "--seed", "3", "--log-every", "4", "--step-delay", "0.12",
         "--stop-check-every", "2", "--checkpoint-seconds", "2"]
TOTAL = 2 * (2048 // 2 // 32)  # steps of the run on 2 nodes of one process


def _spec(tmp_path: Path, name: str) -> Path:
    spec = tmp_path / f"{name}.yaml"
    words = ", ".join(f'"{w}"' for w in TRAIN)
    spec.write_text(f"name: {name}\nimage: ghcr.io/ddpjob/train:0.1.0\ncommand: [python, -m, launcher.train, {words}]\n"
                    "nodes: 2\nprocs_per_node: 1\n")
    return spec


def _events(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _node(pod) -> int:
    """The node (torchrun's node rank) a pod of either API runs: the operator's or the completion index's."""
    return int(pod.injected_env["PET_NODE_RANK"])


@pytest.mark.real
@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_a_deleted_worker_pod_comes_back_and_the_run_resumes_from_the_first_pods_checkpoint(k8s_api, tmp_path, api):
    """The worker pod (node 1) deleted for good (grace 0) a third of the way in: the operator recreates it
    (a PyTorchJob's under its name; a TrainJob's Job a new pod of the same completion index under a new
    name), its new runner waits while the first pod's runner starts torchrun again on both pods, the
    trainer resumes on both ranks from rank 0's newest checkpoint (rank 1's pod has none: sent from rank
    0), the run ends SUCCEEDED with all its steps, and status and wait tell the loss and the goodput (asked
    first once the run has ended: from the first pod's log)."""
    cluster = k8s_api.server
    cluster.own_filesystems = True
    job_id = job_id_of(ddpjob("submit", str(_spec(tmp_path, "lossy")), "--target", "k8s", "--set", f"k8s.api={api}",
                              check=True).stdout)
    master = wait_for(lambda: next((p for p in cluster.pods_of(job_id) if _node(p) == 0 and p.fs_root), None),
                      "the first pod", timeout=60)
    out = Path(master.fs_root + f"/workspace/outputs/{job_id}")
    third = wait_for(lambda: [e for e in _events(out) if e["event"] == "checkpoint" and e["step"] >= TOTAL // 3],
                     "a checkpoint a third of the way in", timeout=240, poll=0.1)
    (worker,) = [p for p in cluster.pods_of(job_id) if _node(p) == 1]
    old_uid, old_proc = worker.uid, worker.proc
    killed = time.time()
    assert cluster.delete_pod(worker.name, grace_s=0) is not None
    newest = max(e["step"] for e in _events(out) if e["event"] == "checkpoint")
    assert newest >= third[0]["step"]
    again = wait_for(lambda: next((p for p in cluster.pods_of(job_id) if _node(p) == 1 and p.uid != old_uid), None),
                     "the worker pod to be recreated", timeout=60)
    assert old_proc.poll() is not None
    if api == "pytorchjob":
        assert again.name == worker.name
    else:  # the Job controller's replacement: a new random suffix, the same completion index
        assert again.name != worker.name and again.name[:-5] == worker.name[:-5] == f"{job_id}-node-0-1-"
        assert again.annotations[COMPLETION_INDEX] == worker.annotations[COMPLETION_INDEX] == "1"

    # Nothing asks ddpjob until the run has ended: the first pod's watch.json went with its pod, and what
    # the run lost comes from the last line its runner printed (podrun.TOLD_LINE), read once from its log.
    wait_for(lambda: (out / "summary.json").exists() and all(p.proc is None or p.proc.poll() is not None
                                                              for p in cluster.pods_of(job_id)),
             "the run to end", timeout=300)
    done = ddpjob("wait", job_id, "--timeout", "300")
    assert done.returncode == 0 and "SUCCEEDED" in done.stdout, done.stdout + done.stderr
    assert "recovered: 1 lost node(s) brought back, goodput" in done.stdout, done.stdout
    # (A PyTorchJob's new worker pod exits 0 with its torchrun, or is removed by cleanPodPolicy Running if
    # the master's end is seen first: how it ends is the operator's, not the recovery's.)

    task = json.loads(ddpjob("status", job_id, "-o", "json", check=True).stdout)["status"]["tasks"][0]
    (loss,) = task["losses"]
    assert loss["node"] == 1 and loss["replaced"] is True and loss["nodes"] == 2, loss
    assert "its node runner started again" in loss["how"] and 0 <= loss["at"] - killed < 30, loss
    assert loss["first_step_at"] - killed < 60, loss  # training went on within a minute of the deletion
    assert loss["checkpoint_step"] >= newest and loss["resumed_step"] == loss["checkpoint_step"], loss
    assert loss["lost_s"] is not None and 0 < task["goodput"] < 1, task
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == TOTAL and summary["world_size"] == 2, summary
    resumes = [e for e in _events(out) if e["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] == loss["resumed_step"] and resumes[0]["restart"] == 1, resumes
    assert resumes[0]["sent_from_rank0"] is True  # rank 1's pod had no checkpoint: rank 0 sent its own

    logs = ddpjob("logs", job_id, check=True).stdout
    # The new worker's own log (a PyTorchJob's pod may be gone by now: cleanPodPolicy Running removes a
    # worker still exiting when the master has ended, and its log with it).
    assert b"[ddpjob] this pod joins start 2 of the run on 2 node(s) (0, 1): this node's rank 1" in bytes(again.log)
    assert "node 1 (" in logs and "was lost: its node runner started again" in logs, logs[-3000:]
    text = ddpjob("status", job_id, check=True).stdout
    assert "lost:" in text and "node 1 lost at" in text and "resumed at step" in text, text
    assert not [p for p in [*cluster.pods_of(job_id), again] if p.proc is not None and p.proc.poll() is None]


@pytest.mark.real
@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_the_first_pod_deleted_comes_back_and_the_others_start_again_with_it(k8s_api, tmp_path, api):
    """The first pod (the master: its runner holds the watch, its torchrun the rendezvous store) deleted
    for good a third of the way in, with the output folder on storage every pod mounts (``output_dir``:
    a PersistentVolumeClaim's mount on a cluster; a folder of this machine here): the operator recreates
    it (a TrainJob's Job under a new name, with completion index 0), its new runner starts the run, the
    worker's runner follows the new watch, training resumes from the newest checkpoint, the run ends
    SUCCEEDED, and status tells node 0's loss."""
    cluster = k8s_api.server
    out = tmp_path / "shared-out"
    spec = _spec(tmp_path, "first")
    spec.write_text(spec.read_text() + f"output_dir: {out}\n")
    job_id = job_id_of(ddpjob("submit", str(spec), "--target", "k8s", "--set", f"k8s.api={api}", check=True).stdout)
    wait_for(lambda: [e for e in _events(out) if e["event"] == "checkpoint" and e["step"] >= TOTAL // 3],
             "a checkpoint a third of the way in", timeout=240, poll=0.1)
    (master,) = [p for p in cluster.pods_of(job_id) if _node(p) == 0]
    (worker,) = [p for p in cluster.pods_of(job_id) if _node(p) == 1]
    killed = time.time()
    assert cluster.delete_pod(master.name, grace_s=0) is not None
    newest = max(e["step"] for e in _events(out) if e["event"] == "checkpoint")

    done = ddpjob("wait", job_id, "--timeout", "300")
    assert done.returncode == 0 and "SUCCEEDED" in done.stdout, done.stdout + done.stderr
    assert "recovered: 1 lost node(s) brought back" in done.stdout, done.stdout
    assert worker.uid in {p.uid for p in cluster.pods_of(job_id)} or worker.proc.poll() is not None  # not replaced
    task = json.loads(ddpjob("status", job_id, "-o", "json", check=True).stdout)["status"]["tasks"][0]
    (loss,) = task["losses"]
    assert loss["node"] == 0 and loss["replaced"] is True and "the first node's runner started again" in loss["how"]
    assert loss["at"] >= killed and loss["resumed_step"] == loss["checkpoint_step"] >= newest, loss
    assert loss["first_step_at"] - killed < 60, loss
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == TOTAL and summary["world_size"] == 2, summary
    logs = ddpjob("logs", job_id, check=True).stdout
    first = "master-0" if api == "pytorchjob" else "node-0"  # how ddpjob logs names each API's first pod
    assert f"[{first} rank0] resumed from {out}/checkpoint.pt at step {loss['resumed_step']} " in logs, logs[-3000:]
    # The worker's own log (its pod may be gone by now: cleanPodPolicy Running removes a worker still
    # exiting when the master has ended, and its log with it).
    assert b"[ddpjob] start 2 of the run on 2 node(s) (0, 1): this node's rank 1" in bytes(worker.log)


@pytest.mark.real
@pytest.mark.parametrize("api", ["pytorchjob", "trainjob", "pytorchjob-onfailure"])
def test_a_loss_past_the_budget_ends_the_run_failed_and_a_restarted_first_pod_does_not_start_it_again(
        k8s_api, tmp_path, api):
    """``recovery.max_losses: 1``, the worker pod deleted twice: the first loss is brought back, the second
    ends the run: the first pod's runner says why and exits 124, which a PyTorchJob's ExitCode policy (its
    default where the runner may end the run) takes as final; a TrainJob's runtime restarts that container
    in place (JobSet's OnFailure), and each restart finds the verdict in its emptyDir and exits again at
    once, without starting the run, until the Job's backoffLimit fails the TrainJob; so does a PyTorchJob's
    set to ``k8s.restart_policy: OnFailure``, until its backoffLimit. ``wait`` says FAILED with the reason;
    no process is left."""
    cluster = k8s_api.server
    cluster.own_filesystems = True
    spec = _spec(tmp_path, "budget")
    spec.write_text(spec.read_text().replace('"--epochs", "2"', '"--epochs", "6"') + "recovery: {max_losses: 1}\n")
    sets = ["--set", "k8s.api=pytorchjob", "--set", "k8s.restart_policy=OnFailure"] if api.endswith("onfailure") \
        else ["--set", f"k8s.api={api}"]
    job_id = job_id_of(ddpjob("submit", str(spec), "--target", "k8s", *sets, check=True).stdout)
    master = wait_for(lambda: next((p for p in cluster.pods_of(job_id) if _node(p) == 0 and p.fs_root), None),
                      "the first pod", timeout=60)
    out = Path(master.fs_root + f"/workspace/outputs/{job_id}")
    wait_for(lambda: [e for e in _events(out) if e["event"] == "checkpoint"], "a checkpoint", timeout=240, poll=0.1)
    for loss in (1, 2):
        (worker,) = [p for p in cluster.pods_of(job_id) if _node(p) == 1]
        assert cluster.delete_pod(worker.name, grace_s=0) is not None
        if loss == 1:  # brought back: training resumes on both pods
            wait_for(lambda: [e for e in _events(out) if e["event"] == "resume" and e["restart"] == 1],
                     "the run to resume after the first loss", timeout=90, poll=0.1)
    done = ddpjob("wait", job_id, "--timeout", "240")
    assert done.returncode != 0 and "FAILED" in done.stdout, done.stdout + done.stderr
    why = "not brought back: the run had lost 1 node(s) before, and recovery.max_losses is 1"
    assert why in done.stdout, done.stdout
    task = json.loads(ddpjob("status", job_id, "-o", "json", check=True).stdout)["status"]["tasks"][0]
    assert task["state"] == "FAILED" and why in task["message"], task
    summary = out / "summary.json"
    assert not summary.exists(), summary.read_text()  # the run never finished
    resumes = [e for e in _events(out) if e["event"] == "resume"]
    assert [e["restart"] for e in resumes] == [1], resumes  # never started again after the verdict
    (first,) = [p for p in cluster.pods_of(job_id) if _node(p) == 0]
    assert first.exit_code == 124, first
    if api == "pytorchjob":
        assert first.restarts == 0  # ExitCode: final
    else:  # each restart in place exited at once
        limit = cluster.trainer.backoff_limit if api == "trainjob" else 3  # k8s.backoff_limit's default
        assert first.restarts == limit, first
        assert b"this pod's runner ended the run; restarted, it does not start torchrun again" in bytes(first.log)
        assert b" of the run on " not in bytes(first.log), bytes(first.log)[-2000:]  # no "start N of the run on ..."
    wait_for(lambda: not [p for p in cluster.pods_of(job_id) if p.proc is not None and p.proc.poll() is None],
             "no pod process left", timeout=60)


class _Logs:
    """A corner stand-in for ``Kube``: the first pod's log, or the API server's refusal."""

    def __init__(self, log: bytes | None = None, refuse: bool = False) -> None:
        self.log, self.refuse, self.asked = log, refuse, 0

    def pod_log(self, name: str, *, previous: bool = False, tail: int | None = None) -> bytes | None:
        from launcher.core.errors import TargetError

        self.asked += 1
        if self.refuse:
            raise TargetError("pods \"x\" is forbidden: User cannot get resource \"pods/log\" (403)")
        return self.log


def test_the_last_told_line_is_read_from_the_end_of_the_first_pods_log_and_a_refusal_is_no_error():
    from launcher.targets.k8s.cluster.watch import last_told
    from launcher.targets.k8s.job.podrun import TOLD_LINE
    from launcher.targets.k8s.objects.apis import PYTORCHJOB

    said = {"recovery": {"losses": [{"node": 1, "at": 5.0, "how": "x"}]}, "events": [], "updated": 9.0}
    log = (f"[master-0 rank0] step 1\n{TOLD_LINE}{json.dumps({'recovery': {}})}\n"  # an earlier one: the last wins
           f"{TOLD_LINE}{json.dumps(said)}\n[ddpjob] recovery: ...\n").encode()
    assert last_told(_Logs(log), "lossy-abcde", PYTORCHJOB) == said
    assert last_told(_Logs(b"[master-0 rank0] step 1\n"), "lossy-abcde", PYTORCHJOB) is None  # no loss: nothing said
    assert last_told(_Logs(f"{TOLD_LINE}{{not json\n".encode()), "lossy-abcde", PYTORCHJOB) is None
    assert last_told(_Logs(None), "lossy-abcde", PYTORCHJOB) is None  # the pod is gone
    refused = _Logs(refuse=True)
    assert last_told(refused, "lossy-abcde", PYTORCHJOB) is None and refused.asked == 1
