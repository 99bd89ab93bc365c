"""slurm.container.runtime oci and podman on the project's real Slurm cluster, with the image that
docker/build.sh builds (docker/engine.sh up): every rank in a container, cancel leaving no container
and no process, the root cause of a failure, and a requeue that resumes.

oci runs through the cluster's oci.conf (runc, written by slurm/cluster.sh); podman through each
node's podman. Needs root, the cluster and podman: skipped with the reason where they cannot run
here, failed instead under CI=true (tests/slurm/conftest.py, tests/container/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_slurm_target import RAISER, records, rendered_script, submit, wait_for, write_spec
from testkit import wait_for as wait_until
from testkit import wait_for_no_job_processes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "container"))
from enginekit import SKIP_CODES, engine_sh, podman

pytestmark = [pytest.mark.slurm, pytest.mark.real]
RECORD = "tests/slurm/rank_record.py"
RUNTIMES = ["oci", "podman"]


@pytest.fixture(scope="module")
def image() -> str:
    """The image docker/build.sh builds (docker/engine.sh up: idempotent, seconds once built)."""
    if os.geteuid() != 0:
        _skip_or_fail("docker/engine.sh up needs root")
    proc = engine_sh("up")
    if proc.returncode in SKIP_CODES:
        _skip_or_fail(f"{SKIP_CODES[proc.returncode]}: {proc.stderr}")
    assert proc.returncode == 0, proc.stderr
    return engine_sh("env").stdout.splitlines()[0].split("=", 1)[1]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Slurm folder for the module: the OCI bundle is made once and reused."""
    return tmp_path_factory.mktemp("slurm-containers")


@pytest.fixture(autouse=True)
def _slurm_env(slurm_cluster, monkeypatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"container tests cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def spec_for(tmp_path: Path, shared: Path, image: str, runtime: str, name: str, command: list[str], **extra) -> Path:  # type: ignore[no-untyped-def]
    return write_spec(tmp_path, name, command, image=image, procs_per_node=2,
                      slurm={"folder": str(shared), "container": {"runtime": runtime}}, **extra)


def containers(cluster, runtime: str, job_id: str, slurm_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The job's containers still known to podman (by name) or to the cluster's runc (by Slurm id)."""
    if runtime == "podman":
        return [n for n in podman("ps", "-a", "--format", "{{.Names}}").stdout.split() if n.startswith(f"ddpjob-{job_id}-")]
    proc = subprocess.run(["runc", f"--root={cluster.root}/runc", "list", "-q"], capture_output=True, text=True,
                          check=True, timeout=60)
    return [c for c in proc.stdout.split() if f".{slurm_id}." in c]


def slurm_pids(slurm_id: str) -> list[int]:
    """Processes of the Slurm job (inside containers too): their environment names the job."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"SLURM_JOB_ID={slurm_id}".encode() in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_rank_runs_in_the_image(slurm_cluster, cli, tmp_path, shared, image, runtime):
    """2 nodes x 2 processes, gloo all-reduce over 4 ranks, each rank in a container: its own mount
    namespace, the image's Python, umask 077; render == submitted; logs with rank prefixes."""
    spec = spec_for(tmp_path, shared, image, runtime, f"ctr-{runtime}", ["python", RECORD, "--allreduce"])
    stale = shared / "oci" / "0123456789ab-0123456789ab"  # a bundle nothing used for 8 days
    stale.mkdir(parents=True, exist_ok=True)
    (stale / ".last-used").touch()
    os.utime(stale / ".last-used", (time.time() - 8 * 86400,) * 2)
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    assert stale.exists() == (runtime != "oci")  # an oci submit prunes unused bundles
    handle = data["handle"]
    recs = records(Path(handle["job_dir"]) / "output")
    assert [r["rank"] for r in recs] == [0, 1, 2, 3] and {r["allreduce_sum"] for r in recs} == {6.0}
    assert {r["host"] for r in recs} == {"n1", "n2"}
    host_ns = os.readlink("/proc/self/ns/mnt")
    assert all(r["mnt_ns"] != host_ns for r in recs), recs
    assert {r["python"] for r in recs} == {"/opt/venv/bin/python3"} and not Path("/opt/venv").exists()
    assert {r["umask"] for r in recs} == {0o77}
    # Render == submitted (the image's id aside: others may rebuild the shared test image meanwhile).
    def same(text: str) -> str:
        return re.sub(r"/oci/[0-9a-f]{12}-", "/oci/<image id>-", text)
    assert same(Path(handle["submission_file"]).read_text()) == same(rendered_script(cli, spec, job_id))
    if runtime == "oci":
        bundle = data["status"]["details"]["container"].removeprefix("oci bundle ")
        assert bundle.startswith(f"{shared}/oci/") and (Path(bundle) / "rootfs" / "opt" / "venv").is_dir()
    logs = cli("logs", job_id, "--rank", "3", timeout=60).stdout
    assert "[node1 rank3] rank 3 of 4 on n2" in logs, logs
    assert not containers(slurm_cluster, runtime, job_id, handle["slurm_job_id"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cancel_leaves_no_container_and_no_process(slurm_cluster, cli, tmp_path, shared, image, runtime, ddpjob_home):
    spec = spec_for(tmp_path, shared, image, runtime, f"cancel-{runtime}", ["python", RECORD, "--sleep", "300"])
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"RUNNING"}, timeout=120)
    sid = data["handle"]["slurm_job_id"]
    wait_until(lambda: len(containers(slurm_cluster, runtime, job_id, sid)) == 2, "a container on each node", timeout=120)
    job_dir = Path(data["handle"]["job_dir"])
    wait_until(lambda: len(list(job_dir.glob("task-0/torchrun-node-*/*/attempt_0/*"))) >= 4, "4 ranks", timeout=120)
    # Where every rank is (issue 44): each node's runner reads its ranks in its container with the image's
    # py-spy and answers through the job's folder.
    found = wait_until(lambda: _every_stack(cli, job_id, 4), "ddpjob stacks to read the 4 ranks in their containers",
                       timeout=90)
    assert {r["node"] for r in found} == {0, 1}, found
    assert all(any(f["file"] == "rank_record.py" for t in r["threads"] for f in t["frames"]) for r in found), found
    if runtime == "oci":  # pruning bundles (keep 0 s: all are old) never removes the one a job in the queue runs
        from launcher.targets.slurm import bundles

        bundle = data["status"]["details"]["container"].removeprefix("oci bundle ")
        pruned = bundles.prune(str(Path(bundle).parent), keep_s=0, now=time.time() + 1)
        assert bundle in pruned.kept_in_use and bundle not in pruned.removed and Path(bundle, "rootfs").is_dir()
    assert cli("cancel", job_id, timeout=120).returncode == 0
    data = wait_for(cli, job_id, {"CANCELLED"}, timeout=60)
    assert data["status"]["tasks"][0]["state"] == "CANCELLED"
    wait_until(lambda: not containers(slurm_cluster, runtime, job_id, sid), "the job's containers to go", timeout=60)
    wait_until(lambda: not slurm_pids(sid), "the job's processes to end", timeout=60)
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel")


def _every_stack(cli, job_id: str, ranks: int) -> list[dict] | None:
    """Every rank ``ddpjob stacks -o json`` read with its frames, once it reads all ``ranks``."""
    proc = cli("stacks", job_id, "-o", "json", timeout=60)
    if proc.returncode != 0:
        return None
    read = [r for r in json.loads(proc.stdout)["ranks"] if r["threads"] and not r["error"]]
    return read if len(read) == ranks else None


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_root_cause_comes_out_of_the_container(slurm_cluster, cli, tmp_path, shared, image, runtime):
    script = tmp_path / "raiser.py"
    script.write_text(RAISER)
    spec = spec_for(tmp_path, shared, image, runtime, f"raise-{runtime}", ["python", str(script)],
                    workdir=str(tmp_path))
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
    message = data["status"]["message"]
    assert data["status"]["state"] == "FAILED" and "ValueError" in message and "bad batch on rank 1" in message, message
    # FAILED once Slurm holds no running allocation: while it is COMPLETING, a node may still be deleting
    # its container (seconds); none is left after that.
    sid = data["handle"]["slurm_job_id"]
    wait_until(lambda: not containers(slurm_cluster, runtime, job_id, sid), "the job's containers to go", timeout=30)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_requeue_resumes_in_the_container(slurm_cluster, cli, tmp_path, shared, image, runtime):
    """An external requeue (scontrol requeue: SIGTERM, SIGKILL after KillWait) stops the containers
    and the requeued run resumes from the trainer's checkpoint, in new containers. (submitit's own
    USR2 requeue runs scontrol inside the task: the image has no Slurm client, see slurm/TARGET.md.)"""
    steps = 20
    command = ["python", "-m", "launcher.train", "--dataset", "linreg", "--model", "linear", "--train-size",
               str(steps * 4 * 8), "--eval-size", "64", "--batch-size", "8", "--epochs", "1", "--lr", "0.01",
               "--checkpoint-every", "4", "--log-every", "1", "--step-delay", "0.4"]
    job_id = submit(cli, str(spec_for(tmp_path, shared, image, runtime, f"rq-{runtime}", command)))
    handle = wait_for(cli, job_id, {"RUNNING"}, timeout=120)["handle"]
    metrics = Path(handle["job_dir"]) / "output" / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and '"step": 6' in metrics.read_text(), "step 6", timeout=180)
    subprocess.run(["scontrol", "requeue", handle["slurm_job_id"]], check=True, timeout=30)
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    events = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    resumed = [e for e in events if e.get("event") == "resume"]
    assert resumed and resumed[0]["step"] >= 4, events  # from its checkpoint, not from scratch
    summary = json.loads((Path(handle["job_dir"]) / "output" / "summary.json").read_text())
    assert summary["steps"] == steps and not summary["preempted"]
    assert all(n["restart"] >= 1 for n in data["status"]["tasks"][0]["nodes"])
    assert not containers(slurm_cluster, runtime, job_id, handle["slurm_job_id"])


def test_oci_on_a_cluster_without_container_support_fails_at_once_saying_so(slurm_cluster, cli, tmp_path, shared, image):
    """Slurm without an oci.conf ignores srun --container and runs the task on the node itself (it
    then died in an import error): each task checks it is in the bundle first, and the job fails
    within 30 s naming what the cluster lacks."""
    conf = slurm_cluster.root / "etc" / "oci.conf"
    away = conf.with_name("oci.conf.away")
    spec = spec_for(tmp_path, shared, image, "oci", "nooci", ["python", RECORD])
    conf.rename(away)  # read by slurmstepd as each step starts: no restart
    try:
        job_id = submit(cli, str(spec))
        data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=30)
    finally:
        away.rename(conf)
    message = data["status"]["message"]
    assert data["status"]["state"] == "FAILED", data["status"]
    assert "slurm.container.runtime oci is not in force" in message and "oci.conf" in message, message
    assert re.match(r"node [01] \(n[12]\): ", message), message
    assert not records(Path(data["handle"]["job_dir"]) / "output")  # no rank ever started
