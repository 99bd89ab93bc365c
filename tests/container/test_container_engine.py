"""The training image and the local target's containers with a real engine (podman), real torchrun
and real gloo process groups across containers. Skipped with the reason where no engine can run
(see conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from enginekit import REPO, engine_sh, job_containers, podman
from testkit import FAILER, SLEEPER, wait_for

from launcher.targets.local import container
from launcher.targets.shared import procs

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

RANKS = '''
import json, os, socket, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
token = [os.urandom(8).hex() if dist.get_rank() == 0 else None]
dist.broadcast_object_list(token, src=0)
rec = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                     "MY_FLAG", "API_TOKEN", "HOST_VALUE", "DDPJOB_JOB_ID", "HOME_ONLY")}
rec.update(sum=t.item(), token=token[0], world=dist.get_world_size(), cwd=os.getcwd(), uid=os.getuid(),
           containerenv=os.path.exists("/run/.containerenv"), pidns=os.readlink("/proc/self/ns/pid"),
           python=sys.executable, torch=torch.__version__)
with open(os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "rank%d.json" % dist.get_rank()), "w") as f:
    json.dump(rec, f)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", t.item(), flush=True)
dist.destroy_process_group()
'''


def ddpjob(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def status(job: str, cwd: Path) -> dict:
    proc = ddpjob("status", job, "-o", "json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def submit(cwd: Path, image: str, *args: str, env: dict[str, str] | None = None) -> str:
    proc = ddpjob("submit", "--target", "local", "--set", "local.container=podman", "--set", f"image={image}",
                  "-q", *args, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[0]


def wait_end(job: str, cwd: Path) -> dict:
    """``ddpjob wait`` (one process, not a poll loop of status calls), then the final status."""
    ddpjob("wait", job, "--timeout", "300", cwd=cwd, timeout=360)
    return status(job, cwd)


def job_processes(job: str) -> list[str]:
    """Every process on this machine whose environment or command line names the job."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (job.encode() in env or job.encode() in cmd) and procs.alive(int(entry)):
            words = cmd.replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{entry}: {words[:200]}")
    return out


def test_image_runs_the_trainer_as_the_unprivileged_user(engine_image):
    proc = podman("run", "--rm", "--network=host", engine_image, "sh", "-c", "id -u; id -g; echo $HOME")
    assert proc.stdout.split() == ["1000", "1000", "/home/trainer"]
    proc = podman("run", "--rm", "--network=host", engine_image, "python", "-m", "launcher.train", "--help")
    assert "usage: python -m launcher.train" in proc.stdout
    proc = podman("run", "--rm", "--network=host", engine_image, "python", "-c",
                  "import torch, submitit, launcher.train; print(torch.__version__, torch.cuda.is_available())")
    version, cuda = proc.stdout.split()
    assert version.endswith("+cpu") and cuda == "False"  # the CPU variant
    assert podman("image", "inspect", "--format", "{{.Config.User}}", engine_image).stdout.strip() == "1000:1000"


def test_build_secret_lands_in_no_layer(engine_image):
    """docker/build.sh --host-pip passed this machine's pip configuration as a build secret (its
    file starts with a line naming itself): no file of the image holds that line, and pip inside
    the image has none of the host's settings."""
    marker = "passed by docker/build.sh as a build secret"
    assert marker in (REPO / "docker" / "build.sh").read_text()
    root = podman("image", "mount", engine_image).stdout.strip()
    try:
        found = subprocess.run(["grep", "-rlIF", "--exclude-dir=proc", "--exclude-dir=sys", marker, root],
                               capture_output=True, text=True, timeout=300, check=False)
        assert found.returncode == 1 and not found.stdout, found.stdout  # 1: no match
    finally:
        podman("image", "unmount", engine_image, check=False)
    conf = podman("run", "--rm", "--network=host", engine_image, "pip", "config", "list").stdout
    assert "find-links" not in conf and "index-url" not in conf and "cert" not in conf, conf


def test_quickstart_on_two_nodes_inside_the_image(engine_image, tmp_path):
    """jobs/quickstart.yaml, 2 nodes, the image's own trainer (submitted from an empty folder):
    SUCCEEDED, and every rank ran in a container (another pid namespace) named after the job."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "submit", str(REPO / "jobs" / "quickstart.yaml"),
                             "--target", "local", "--nodes", "2", "--set", "local.container=podman",
                             "--set", f"image={engine_image}", "-f"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    host_ns = os.readlink("/proc/self/ns/pid")
    job, seen_containers, ranks = None, set(), {}
    try:
        deadline = time.monotonic() + 600
        # Watch the running job (sparingly: the machine's cores run the job too) until both
        # containers and both ranks have been seen.
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
            if job is None:
                runs = Path(os.environ["DDPJOB_HOME"]) / "runs"
                job = next((p.name for p in runs.iterdir()), None) if runs.is_dir() else None
            if job is None or (len(ranks) == 2 and len(seen_containers) == 2):
                continue
            seen_containers.update(n for n in podman("ps", "--format", "{{.Names}}").stdout.split() if job in n)
            for pid in procs.marked_pids("DDPJOB_JOB_ID", job):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
                    if b"RANK" in env and b"LOCAL_RANK" in env:  # a worker (torchrun sets these)
                        ranks[env[b"RANK"].decode()] = os.readlink(f"/proc/{pid}/ns/pid")
                except OSError:
                    pass
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and f"{job}: SUCCEEDED" in out, out
    assert "world size 2" in out
    assert seen_containers == {f"ddpjob-{job}-0-0", f"ddpjob-{job}-0-1"}
    assert set(ranks) == {"0", "1"} and host_ns not in ranks.values(), ranks
    assert ranks["0"] != ranks["1"]  # two containers, two pid namespaces
    out_dir = Path(os.environ["DDPJOB_HOME"]) / "runs" / job / "output"
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary and (out_dir / "metrics.jsonl").stat().st_size > 0
    # Files the containers wrote are the user's and private, as without containers.
    for f in out_dir.iterdir():
        st = f.stat()
        assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0, (f, oct(st.st_mode))
    assert job_containers(Path(os.environ["DDPJOB_HOME"])) == []  # removed at their end


def test_user_script_sees_ranks_world_size_and_one_rendezvous(engine_image, tmp_path):
    (tmp_path / "ranks.py").write_text(RANKS)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: ranks\ncommand: [python, ranks.py]\nnodes: 2\nenv: {MY_FLAG: 'a b;c', API_TOKEN: s3cr3t}\n"
                    "env_from_host: [HOST_VALUE]\n")
    job = submit(tmp_path, engine_image, str(spec), env={"HOST_VALUE": "from-the-shell", "HOME_ONLY": "not-passed"})
    st = wait_end(job, tmp_path)
    assert st["state"] == "SUCCEEDED", st
    out_dir = Path(os.environ["DDPJOB_HOME"]) / "runs" / job / "output"
    recs = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    port = str(st["port"])
    host_ns = os.readlink("/proc/self/ns/pid")
    for r, rec in enumerate(recs):
        assert rec["RANK"] == str(r) and rec["LOCAL_RANK"] == "0" and rec["WORLD_SIZE"] == "2" and rec["world"] == 2
        assert rec["MASTER_ADDR"] == "127.0.0.1" and rec["MASTER_PORT"] == port
        assert rec["sum"] == 3.0  # 1 + 2: one process group across the two containers
        assert rec["containerenv"] and rec["pidns"] != host_ns and rec["python"].startswith("/opt/venv/")
        assert rec["torch"].endswith("+cpu") and rec["cwd"] == str(tmp_path) and rec["uid"] == os.getuid()
        assert rec["MY_FLAG"] == "a b;c" and rec["API_TOKEN"] == "s3cr3t" and rec["HOST_VALUE"] == "from-the-shell"
        assert rec["HOME_ONLY"] is None  # only the job's variables enter the container
        assert rec["DDPJOB_JOB_ID"] == job
    assert recs[0]["token"] == recs[1]["token"] and recs[0]["pidns"] != recs[1]["pidns"]
    logs = ddpjob("logs", job, "--rank", "1", cwd=tmp_path)
    assert logs.returncode == 0 and "[node1 rank1] rank 1 of 2 sum 3.0" in logs.stdout, logs.stdout
    plan_txt = (Path(os.environ["DDPJOB_HOME"]) / "runs" / job / "plan.txt").read_text()
    assert "s3cr3t" not in plan_txt and "from-the-shell" not in plan_txt and "podman run --rm --init" in plan_txt


def test_cancel_leaves_no_container_and_no_process(engine_image, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    job = submit(tmp_path, engine_image, "--nodes", "2", "--", "python", "sleeper.py")
    out_dir = Path(os.environ["DDPJOB_HOME"]) / "runs" / job / "output"
    wait_for(lambda: all((out_dir / f"started-{r}").exists() for r in (0, 1)), "both ranks to start", poll=0.3)
    names = set(podman("ps", "--format", "{{.Names}}").stdout.split())
    assert {f"ddpjob-{job}-0-0", f"ddpjob-{job}-0-1"} <= names
    assert job_processes(job)  # the check below can see the job's processes
    proc = ddpjob("cancel", job, cwd=tmp_path, timeout=30)  # stops and removes both containers within 30 s
    assert proc.returncode == 0, proc.stderr
    assert status(job, tmp_path)["state"] == "CANCELLED"
    assert job_containers(Path(os.environ["DDPJOB_HOME"])) == []
    assert job_processes(job) == []  # engine clients, conmon, the containers' init, agents, workers
    again = ddpjob("cancel", job, cwd=tmp_path)  # safe to repeat
    assert again.returncode == 0, again.stderr


def test_cancel_after_the_supervisor_and_the_engine_clients_were_killed(engine_image, tmp_path):
    """As after the OOM killer: the supervisor and the `podman run` clients are gone, the containers
    run on (conmon keeps them). status stays RUNNING, and cancel still stops and removes everything."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    job = submit(tmp_path, engine_image, "--nodes", "2", "--", "python", "sleeper.py")
    out_dir = Path(os.environ["DDPJOB_HOME"]) / "runs" / job / "output"
    wait_for(lambda: all((out_dir / f"started-{r}").exists() for r in (0, 1)), "both ranks to start", poll=0.3)
    handle = status(job, tmp_path)["handle"]
    os.kill(handle["pid"], signal.SIGKILL)
    clients = [p for p in procs.marked_pids("DDPJOB_JOB_ID", job)
               if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"podman\0run\0")]
    assert len(clients) == 2
    for p in clients:
        os.kill(p, signal.SIGKILL)
    wait_for(lambda: not any(procs.alive(p) for p in clients), "the clients to go", timeout=10, poll=0.3)
    assert len(set(podman("ps", "--format", "{{.Names}}").stdout.split()) & {f"ddpjob-{job}-0-0", f"ddpjob-{job}-0-1"}) == 2
    assert status(job, tmp_path)["state"] == "RUNNING"
    proc = ddpjob("cancel", job, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert status(job, tmp_path)["state"] == "CANCELLED"
    assert job_containers(Path(os.environ["DDPJOB_HOME"])) == []
    assert job_processes(job) == []


def test_remove_takes_running_created_and_missing_containers(engine_image):
    """What cancel and the supervisor call: containers named after a job go, whatever their state,
    even with no process of the job left to find (a container created but never started)."""
    names = [f"ddpjob-rmtest{os.getpid()}-0-{i}" for i in range(3)]
    try:
        podman("run", "-d", "--name", names[0], "--network=host", engine_image, "sleep", "600")
        podman("create", "--name", names[1], "--network=host", engine_image, "sleep", "600")
        assert container.existing("podman", names) == names[:2]
        assert container.remove("podman", names) == []  # names[2] never existed: fine
        assert container.existing("podman", names) == []
    finally:
        podman("rm", "-f", "-t", "0", *names[:2], check=False)


def test_root_cause_of_a_failing_rank_in_a_container(engine_image, tmp_path):
    (tmp_path / "failer.py").write_text(FAILER)
    job = submit(tmp_path, engine_image, "--nodes", "2", "--", "python", "failer.py")
    st = wait_end(job, tmp_path)
    assert st["state"] == "FAILED" and "rank 1" in st["message"] and "boom" in st["message"], st
    assert job_containers(Path(os.environ["DDPJOB_HOME"])) == []  # the other node was stopped and removed
    wait_for(lambda: job_processes(job) == [], "no process of the job", timeout=30, poll=0.3)


def test_engine_sh_is_idempotent_and_says_what_it_is(engine_image):
    up = engine_sh("up", timeout=120)  # cached: no debootstrap, torch's layer kept (a fresh build takes minutes)
    assert up.returncode == 0, up.stderr
    assert "debootstrap" not in up.stderr and "ready" in up.stderr
    assert engine_sh("status").returncode == 0
    assert engine_sh("up", "--bogus").returncode == 2
    assert engine_sh("bogus").returncode == 2
