"""The stall watch on Kubernetes (issue 34): each pod runs ddpjob's pod runner in front of torchrun
(launcher/targets/k8s/job/podrun.py, carried in the pod's env), the first pod's runner serves its
watch.json, and status reads it through the API server's pod proxy. Real torchrun and gloo in the
loopback API server's pods; one rank is stopped with SIGSTOP.

Each pod's runner samples its ranks (shared/vitals.py) and sends them with its heartbeat, so the
watch names the stopped *rank* (not only a run in which no node writes output), and ``ddpjob top``
shows every rank's CPU, memory and output age, as on the other targets.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fake_apiserver
import pytest
from test_k8s_target import REPO, job_id_of, run

from launcher.targets.k8s.job.podrun import END_EXIT
from launcher.targets.k8s.objects import runner
from launcher.targets.k8s.payload import K8sHandle, K8sRun
from launcher.targets.k8s.target import KubernetesTarget

STUCK = "is stopped (SIGSTOP?) since"  # what status says of the stopped rank (shared/heartbeat.py)
TIMEOUT_S = 8  # stall.timeout, below the spec's 20 s minimum through the test-only floor (FLOOR)
# With stall.action: fail a quiet start ends the run for good: four torchruns importing torch at once on a
# loaded 2-core machine may print nothing for longer than 8 s, so that test takes the spec's own minimum.
FAIL_TIMEOUT_S = 20
FLOOR = ("DDPJOB_TEST_STALL_MIN_S", "5")

STEPS = """\
import sys, threading, time
stepping = threading.Event()
def starting():  # torch's import and the rendezvous take longer than the short stall timeout on a loaded
    while not stepping.wait(1.0):  # machine: said each second until the first step, so only a stop is a stall
        print("starting", flush=True)
threading.Thread(target=starting, daemon=True).start()
import torch, torch.distributed as dist
dist.init_process_group("gloo")
for step in range(10000):
    t = torch.ones(1)
    dist.all_reduce(t)
    stepping.set()
    print(f"step {step} rank {dist.get_rank()}", flush=True)
    time.sleep(0.5)
"""


def submit(script: Path, action: str, api: str = "pytorchjob", timeout: int = TIMEOUT_S) -> str:
    code, out = run("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s", "--nodes", "2",
                    "--procs-per-node", "1", "--set", f"command=[python, {script}]", "--set", f"k8s.api={api}",
                    "--set", f"stall.timeout={timeout}", "--set", f"stall.action={action}")
    assert code == 0, out
    return job_id_of(out)


def status(job_id: str) -> dict:
    code, out = run("status", job_id, "-o", "json")
    assert code in (0, 1), out
    return json.loads(out)


def stop_a_rank(cluster: fake_apiserver.FakeCluster, job: str) -> int:
    """SIGSTOP the training process of node 1's pod (a PyTorchJob's Worker, a TrainJob's index 1): the
    runner's torchrun's child."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = [p for p in cluster.pods_of(job) if p.rtype in ("Worker", "Node") and p.index == (p.rtype == "Node")
                and p.proc is not None]
        if pods and b"step 2 rank 1" in bytes(pods[0].log):
            tree = fake_apiserver.descendants(pods[0].proc.pid)  # runner -> torchrun -> the rank
            rank = tree[-1]
            os.kill(rank, signal.SIGSTOP)
            return rank
        time.sleep(0.5)
    raise AssertionError(f"rank 1 never printed: {[bytes(p.log)[-500:] for p in cluster.pods_of(job)]}")


def wait_for(job_id: str, until, limit: float) -> dict:
    deadline = time.monotonic() + limit
    while True:
        st = status(job_id)
        if until(st) or time.monotonic() > deadline:
            return st
        time.sleep(1)


@pytest.fixture
def steps(tmp_path: Path) -> Path:
    path = tmp_path / "steps.py"
    path.write_text(STEPS)
    return path


@pytest.mark.real
def test_a_stopped_rank_is_named_by_status_within_the_stall_timeout(k8s_api, steps, tmp_path, monkeypatch):
    """One job of each API at once (the same runner; one stall timeout of waiting for both)."""
    monkeypatch.setenv("DDPJOB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(*FLOOR)
    jobs = {api: submit(steps, "report", api) for api in ("pytorchjob", "trainjob")}
    ranks: dict[str, int] = {}
    stopped: dict[str, float] = {}
    try:
        for api, job_id in jobs.items():
            ranks[api] = stop_a_rank(k8s_api.server, job_id)
            stopped[api] = time.time()
        for api, job_id in jobs.items():
            st = wait_for(job_id, lambda s: "stalled:" in s["message"], stopped[api] + TIMEOUT_S + 30 - time.time())
            assert STUCK in st["message"] and st["state"] == "RUNNING", (api, st)
            assert f"pid {ranks[api]}) on node 1" in st["message"], (api, ranks[api], st)  # that rank, on its node
            # HH:MM:SS: when the watch last saw output grow (it looks every 2 s), about when the rank stopped
            since = st["message"].split(STUCK, 1)[1].split()[0].rstrip(",")
            apart = (_seconds_of_day(stopped[api]) - _seconds_of_day(since)) % 86400
            assert min(apart, 86400 - apart) < 10, (api, since, st)
            # The raw watch.json, as `top` will read it.
            watch = KubernetesTarget().read_watch(handle_of(job_id, api))
            assert watch is not None and watch["verdict"]["kind"] == "stuck" and len(watch["nodes"]) == 2, watch
            # top: every rank of both pods with its CPU, memory and output age; the stopped one flagged
            code, out = run("top", job_id, "--once", "-o", "json")
            assert code == 0, out
            health = json.loads(out)["health"]
            ranks_seen = [r for n in health["nodes"] for r in n["ranks"]]
            assert sorted(r["rank"] for r in ranks_seen) == [0, 1], health
            assert all(r["rss_bytes"] and r["output_age_s"] is not None for r in ranks_seen), health
            assert any(r["cpu_pct"] is not None for r in ranks_seen), health
            assert [r["rank"] for r in ranks_seen if r["flag"] == "stuck"] == [1], health
        _, out = run("list")  # the same text in list, for both
        assert sorted(line.split()[0] for line in out.splitlines() if "stalled: rank 1 " in line) == \
            sorted(jobs.values()), out
    finally:
        for rank in ranks.values():
            os.kill(rank, signal.SIGCONT)
        for job_id in jobs.values():
            run("cancel", job_id)


@pytest.mark.real
def test_stall_action_fail_ends_the_job_failed_naming_it_and_leaves_no_process(k8s_api, steps, tmp_path, monkeypatch):
    """One job of each API at once. A PyTorchJob fails on its runner's exit code (restartPolicy ExitCode).
    A TrainJob's runtime restarts the pod (JobSet's OnFailure, which a TrainJob cannot change): its runner
    finds the verdict it kept in its emptyDir volume and exits again at once, without starting torchrun,
    until the Job's backoffLimit fails the TrainJob; between the restarts (the kubelet's back-off) status
    says so."""
    monkeypatch.setenv("DDPJOB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(*FLOOR)
    cluster = k8s_api.server
    cluster.trainer.restart_delay, cluster.trainer.backoff_limit = 3.0, 3
    jobs = {api: submit(steps, "fail", api, FAIL_TIMEOUT_S) for api in ("pytorchjob", "trainjob")}
    trees: dict[str, list[int]] = {}

    def note_processes(job_id: str) -> None:
        for p in cluster.pods_of(job_id):
            if p.proc:
                trees.setdefault(p.name, [])
                trees[p.name] += [p.proc.pid, *fake_apiserver.descendants(p.proc.pid)]

    for job_id in jobs.values():
        note_processes(job_id)
        stop_a_rank(cluster, job_id)
        note_processes(job_id)
    st = wait_for(jobs["trainjob"], lambda s: "is restarted in place" in s["message"] or s["state"] != "RUNNING",
                  FAIL_TIMEOUT_S + 60)
    assert st["state"] == "RUNNING" and st["message"].startswith("stalled: ") and STUCK in st["message"], st
    assert "until the backoffLimit fails the job" in st["message"], st
    row = next(n for n in st["status"]["tasks"][0]["nodes"] if n["node"] == 0)
    assert row["last_exit_code"] == END_EXIT and row["restarts"] >= 1, row
    listed = json.loads(run("list", "-o", "json")[1])  # list asks no pod rows: it finds the restart itself
    tj = next(j for j in listed if j["id"] == jobs["trainjob"])
    assert tj["state"] == "RUNNING" and tj["message"].startswith("stalled: ") and "ended it" in tj["message"], tj
    for api, job_id in jobs.items():
        st = wait_for(job_id, lambda s: s["state"] == "FAILED", FAIL_TIMEOUT_S + 60)
        assert st["state"] == "FAILED" and st["message"].startswith("stalled: ") and STUCK in st["message"], (api, st)
        assert not [p.name for p in cluster.pods_of(job_id) if p.phase in ("Running", "Pending")], api
        note_processes(job_id)
    master = next(p for p in cluster.pods_of(jobs["pytorchjob"]) if p.rtype == "Master")
    assert master.exit_code == END_EXIT and master.restarts == 0  # ExitCode: not restarted
    first = next(p for p in cluster.pods_of(jobs["trainjob"]) if p.index == 0)
    assert first.exit_code == END_EXIT and first.restarts == cluster.trainer.backoff_limit, first
    again = bytes(first.log).decode()  # its last start: the kept verdict, and no torchrun
    assert "does not start torchrun again" in again and STUCK in again and "step " not in again, again
    time.sleep(1)
    alive = [pid for pids in trees.values() for pid in pids if _alive(pid)]
    assert not alive, alive


def test_a_trainjob_with_stall_fail_keeps_the_verdict_in_a_volume_of_its_own():
    from launcher.core.errors import SpecError

    tj = plan("stall.action=fail", "k8s.api=trainjob").payload.manifests[0]
    pod = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"]["template"]["spec"]
    assert {"name": runner.MARK_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}} in pod["volumes"]
    assert {"name": runner.MARK_VOLUME, "mountPath": runner.MARK_DIR} in pod["containers"][0]["volumeMounts"]
    env = {e["name"]: e.get("value") for e in tj["spec"]["trainer"]["env"]}
    assert env[runner.MARK_ENV] == f"{runner.MARK_DIR}/verdict"
    # Nothing that ends the run (report, no recovery), or a PyTorchJob (ExitCode, the default there): no mark
    for other in (("k8s.api=trainjob", "recovery.max_losses=0"), ("stall.action=fail",), ()):
        text = json.dumps(plan(*other).payload.manifests)
        assert runner.MARK_VOLUME not in text and runner.MARK_ENV not in text, other
    with pytest.raises(SpecError) as e:
        plan("stall.action=fail", "k8s.api=trainjob",
             f"k8s.volumes=[{{name: data, mount_path: {runner.MARK_DIR}, pvc: data}}]")
    assert "k8s.volumes" in str(e.value) and runner.MARK_VOLUME in str(e.value)


@pytest.mark.real
def test_a_restarted_runner_that_finds_the_verdict_starts_nothing(tmp_path):
    """The runner itself, as a TrainJob's restarted container runs it: the kept verdict is said again
    and the runner exits END_EXIT without starting its command."""
    import subprocess
    import sys

    mark = tmp_path / "verdict"
    started = tmp_path / "started"
    env = {"PATH": os.environ["PATH"], runner.BUNDLE_ENV: runner.bundle(), "DDPJOB_WATCH_PORT": "0",
           "MASTER_PORT": str(fake_apiserver.free_port()), "TMPDIR": str(tmp_path), runner.MARK_ENV: str(mark)}
    argv = [sys.executable, "-I", "-S", "-c", runner.BOOT, "sh", "-c", f"touch {started}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and started.exists(), done  # no mark: its command runs
    started.unlink()
    for line in ("[ddpjob] stall.action fail: rank 1 (pid 7) on node 1 is stopped (SIGSTOP?) since 01:02:03",
                 "[ddpjob] recovery: node 1 (h) was lost: ...; not brought back: 1 node(s) left, fewer than "
                 "recovery.min_nodes (2)"):
        mark.write_text(line)  # the line the runner ended the run with, kept (podrun.PodRunner._end)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == END_EXIT and not started.exists(), done
        assert done.stdout.startswith(line + "\n[ddpjob] this pod's runner ended the run;"), done.stdout


def handle_of(job_id: str, api: str = "pytorchjob") -> K8sHandle:
    return K8sHandle(job_id=job_id, run_dir="", namespace="default", nodes=2, jobs=[K8sRun(0, job_id)],
                     watch_port=runner.DEFAULT_PORT + 1, api=api)


def _seconds_of_day(t: float | str) -> int:
    parts = time.localtime(t) if isinstance(t, float) else time.strptime(t, "%H:%M:%S")
    return parts.tm_hour * 3600 + parts.tm_min * 60 + parts.tm_sec


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- the proxy read, no processes

WATCH = {"updated": 0, "timeout": 20.0, "action": "report", "interval": 2.0,
         "nodes": [{"node": 0, "host": "m", "heard": 0, "output": 0, "bytes": 5},
                   {"node": 1, "host": "w", "heard": 0, "output": 0, "bytes": 5}],
         "verdict": {"node": 1, "host": "w", "kind": "lost", "since": 0,
                     "message": "node 1 (w) went silent: no heartbeat since 01:02:03 (40 s; stall timeout 20 s)"}}


@pytest.fixture
def served_watch(k8s_api):
    """A pod of job `demo` whose port 29501 (its DDPJOB_WATCH_PORT) serves WATCH, as the runner does."""
    class Serve(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps(WATCH).encode() if self.path == "/watch.json" else b"{}"
            self.send_response(200 if self.path == "/watch.json" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Serve)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    c = k8s_api.server
    container = {"name": "pytorch", "env": [{"name": "DDPJOB_WATCH_PORT", "value": "29501"}]}
    c.pods[("default", "demo-master-0")] = fake_apiserver.Pod("demo-master-0", "default", "demo", "Master", 0, {},
                                                              container, "OnFailure", {}, 0.0)
    c.watch_ports[("default", "demo")] = httpd.server_address[1]
    yield k8s_api
    httpd.shutdown()


def test_status_reads_the_first_pods_watch_through_the_pod_proxy(served_watch):
    from launcher.targets.k8s.cluster.client import Kube
    from launcher.targets.k8s.cluster.watch import note

    kube = Kube()
    assert KubernetesTarget().read_watch(handle_of("demo")) == WATCH
    said, _ = note(kube, "demo-master-0", 29501)
    assert said == "stalled: " + WATCH["verdict"]["message"]  # heartbeat.report, as on Slurm
    assert served_watch.server.requests_to("/pods/demo-master-0:29501/proxy/watch.json") or \
        served_watch.server.requests_to("/pods/demo-master-0%3A29501/proxy/watch.json")
    assert note(kube, "demo-master-0", 29502) == (None, None)  # nothing listens there: 503, nothing to say yet


def test_a_user_without_pods_proxy_gets_one_line_in_status(served_watch):
    from launcher.targets.k8s.cluster.client import Kube
    from launcher.targets.k8s.cluster.watch import note

    served_watch.server.fail_next("GET", r"/proxy", 403)
    said, _ = note(Kube(), "demo-master-0", 29501)
    assert said is not None and said.startswith("watch unreadable: permission denied (403)") and "\n" not in said, said
    assert said.endswith("k8s/rbac.yaml grants it (pods/proxy get; ddpjob docs k8s/rbac.yaml prints it)"), said


# --------------------------------------------------------------------------- the plan

def plan(*overrides: str):
    from launcher.spec.load import load_spec
    from launcher.targets.base import PlanContext

    loaded = load_spec(REPO / "jobs" / "quickstart.yaml", overrides=["nodes=2", *overrides])
    target = KubernetesTarget()
    return target.plan(loaded, PlanContext(job_id="demo-abcde", run_dir="/r", home="/h", cwd="/c",
                                           inputs=target.inputs(loaded, online=False)))


def pods_of(manifest: dict) -> list[dict]:
    if manifest["kind"] == "TrainJob":
        return [manifest["spec"]["trainer"]]
    return [r["template"]["spec"]["containers"][0] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_every_pod_starts_the_runner_carrying_the_packages_own_modules(api):
    import base64
    import zlib

    import launcher.targets.k8s.job.podrun as podrun
    import launcher.targets.k8s.job.podstacks as podstacks
    import launcher.targets.shared.heartbeat as heartbeat
    import launcher.targets.shared.jobcore as jobcore
    import launcher.targets.shared.restarts as restarts
    import launcher.targets.shared.runfolder as runfolder
    import launcher.targets.shared.stacks as stacks
    import launcher.targets.shared.stackshare as stackshare
    import launcher.targets.shared.straggle as straggle
    import launcher.targets.shared.told as told
    import launcher.targets.shared.vitals as vitals

    p = plan(f"k8s.api={api}", "stall.timeout=45")
    for c in pods_of(p.payload.manifests[0]):
        assert c["command"][:4] == ["python3", "-c", runner.BOOT, "torchrun"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["DDPJOB_STALL_TIMEOUT_S"] == "45" and env["DDPJOB_STALL_ACTION"] == "report"
        assert env["DDPJOB_WATCH_PORT"] == "29501"
        assert (env["DDPJOB_MAX_LOSSES"], env["DDPJOB_MIN_NODES"], env["DDPJOB_LOST_AFTER_S"]) == ("10", "1", "30")
        modules = dict(json.loads(zlib.decompress(base64.b64decode(env[runner.BUNDLE_ENV]))))
        assert modules == {"ddpjob_runfolder": Path(runfolder.__file__).read_text(),
                           "ddpjob_straggle": Path(straggle.__file__).read_text(),
                           "ddpjob_vitals": Path(vitals.__file__).read_text(),
                           "ddpjob_heartbeat": Path(heartbeat.__file__).read_text(),
                           "ddpjob_restarts": Path(restarts.__file__).read_text(),
                           "ddpjob_told": Path(told.__file__).read_text(),
                           "ddpjob_stacks": Path(stacks.__file__).read_text(),
                           "ddpjob_stackshare": Path(stackshare.__file__).read_text(),
                           "ddpjob_jobcore": Path(jobcore.__file__).read_text(),
                           "ddpjob_podstacks": Path(podstacks.__file__).read_text(),
                           "ddpjob_podrun": Path(podrun.__file__).read_text()}
    text = p.render()
    assert "pods start ddpjob's pod runner" in text and runner.shown(env[runner.BUNDLE_ENV]) in text
    assert env[runner.BUNDLE_ENV] not in text  # shortened: 8 kB of base64 is not for reading


def test_render_does_not_load_the_runner_and_says_its_exit_code():
    import subprocess
    import sys

    code = ("import sys; from launcher.targets.k8s.objects import runner; from launcher.targets.k8s import target; "
            "print(sorted(m for m in ('launcher.targets.k8s.job.podrun', 'http.server', 'subprocess') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    assert runner.END_EXIT == END_EXIT


def test_k8s_runner_none_runs_torchrun_bare_and_refuses_stall_fail():
    from launcher.core.errors import SpecError

    p = plan("k8s.runner=none")
    for c in pods_of(p.payload.manifests[0]):
        assert c["command"][0] == "torchrun" and not [e for e in c["env"] if e["name"].startswith("DDPJOB_STALL")]
    assert p.payload.watch_port == 0 and "no stall watch" in p.render()
    with pytest.raises(SpecError) as e:
        plan("k8s.runner=none", "stall.action=fail")
    assert "stall.action" in str(e.value) and "k8s.runner: none" in str(e.value)
    with pytest.raises(SpecError) as e:  # an elastic job runs torchrun bare: no first node to watch
        plan("k8s.elastic={min_nodes: 2, max_nodes: 3}", "stall.action=fail")
    assert "stall.action" in str(e.value) and "elastic" in str(e.value)


def test_stall_fail_makes_a_pytorchjob_fail_on_the_runners_exit_code_not_restart():
    from launcher.core.errors import SpecError

    specs = plan("stall.action=fail").payload.manifests[0]["spec"]["pytorchReplicaSpecs"]
    assert {r["restartPolicy"] for r in specs.values()} == {"ExitCode"}
    # The runner may end the run with recovery on too (the default on 2 nodes or more); with neither, OnFailure.
    assert {r["restartPolicy"] for r in plan().payload.manifests[0]["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    bare = plan("recovery.max_losses=0").payload.manifests[0]["spec"]["pytorchReplicaSpecs"]
    assert {r["restartPolicy"] for r in bare.values()} == {"OnFailure"}
    specs = plan("stall.action=fail", "k8s.restart_policy=Never").payload.manifests[0]["spec"]["pytorchReplicaSpecs"]
    assert {r["restartPolicy"] for r in specs.values()} == {"Never"}
    with pytest.raises(SpecError) as e:
        plan("stall.action=fail", "k8s.restart_policy=OnFailure")
    assert "k8s.restart_policy" in str(e.value) and "ExitCode" in str(e.value)


@pytest.mark.real
def test_the_runner_in_a_bare_python_passes_output_exit_code_and_sigterm_on(tmp_path):
    """The bundle in an interpreter without ddpjob (-I -S: no PYTHONPATH, no site-packages, so nothing of
    ddpjob is importable, as in a user's image; the watch runs, so its modules load): the child's output
    and exit code come through, and SIGTERM (how the kubelet stops a pod) reaches the child."""
    import subprocess
    import sys

    tmp = tmp_path / "tmp"  # the pod's /tmp: the runner's own folder is gone after it
    tmp.mkdir()
    env = {"PATH": os.environ["PATH"], runner.BUNDLE_ENV: runner.bundle(), "DDPJOB_WATCH_PORT": "0",
           "MASTER_PORT": str(fake_apiserver.free_port()), "TMPDIR": str(tmp)}
    boot = [sys.executable, "-I", "-S", "-c", runner.BOOT]
    done = subprocess.run([*boot, "sh", "-c", f"echo out; env | grep -c {runner.BUNDLE_ENV}; exit 3"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (3, "out\n0\n"), done  # the bundle is not passed on to torchrun
    marker = tmp_path / "got-term"
    child = f"trap 'echo term > {marker}; exit 143' TERM; echo ready; while true; do sleep 0.1; done"
    proc = subprocess.Popen([*boot, "sh", "-c", child], env=env, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143 and marker.read_text() == "term\n"
    assert list(tmp.iterdir()) == []


# --------------------------------------------------------------------------- a restarted pod's exit 124, no processes

class _Kube:
    """The two calls ``cluster.watch.ending`` makes, answering with one restarted TrainJob pod."""

    def __init__(self, previous_log: bytes) -> None:
        self.previous_log, self.asked = previous_log, []

    def list_pods(self, selector: str) -> list[dict]:
        return [{"metadata": {"name": "demo-node-0-0-abcde"}, "status": {"containerStatuses": [
            {"name": "node", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": END_EXIT}}}]}}]

    def pod_log(self, name: str, *, previous: bool = False, tail: int | None = None) -> bytes:
        self.asked.append(previous)
        return self.previous_log if previous else b""


def test_a_restarted_pod_is_said_stalled_only_when_its_runner_said_so():
    """Exit 124 from the previous container is the stall watch's only with the runner's line in its log
    (a program of the user's may exit 124 itself)."""
    from launcher.targets.k8s.objects.apis import TRAINJOB
    from launcher.targets.k8s.status import _restarting_after_end

    rows = [{"node": 0, "pod": "demo-node-0-0-abcde", "last_exit_code": END_EXIT, "waiting": "CrashLoopBackOff"}]
    said = _Kube(b"step 3\n[ddpjob] stall.action fail: rank 1 (pid 9) on node 1 is stopped (SIGSTOP?) since 01:02:03\n")
    text = _restarting_after_end(said, "demo", TRAINJOB, rows)
    assert text is not None and text.startswith("stalled: rank 1 (pid 9) on node 1 is stopped"), text
    assert "stall.action fail ended it: the pod is restarted in place" in text and said.asked == [True]  # previous log
    assert _restarting_after_end(_Kube(b"my program timed out\n"), "demo", TRAINJOB, rows) is None
    lost = _Kube(b"[ddpjob] recovery: node 1 (h) was lost: its pod; not brought back: the run had lost 1 node(s) "
                 b"before, and recovery.max_losses is 1\n[ddpjob] this pod's runner ended the run; restarted, ...\n")
    text = _restarting_after_end(lost, "demo", TRAINJOB, rows)  # a loss past the budget, said by the runner
    assert text is not None and text.startswith("node 1 (h) was lost: its pod; not brought back: the run had lost 1 "
                                                "node(s) before, and recovery.max_losses is 1; recovery ended it"), text
    assert _restarting_after_end(said, "demo", TRAINJOB, [{**rows[0], "last_exit_code": 1}]) is None


def test_a_failed_run_is_named_stalled_the_first_time_it_is_seen_by_list_or_status():
    """``list`` records a job that ended: the first look at a FAILED run, by either, asks the pods why
    (the Master's runner exited 124 and said so); later looks keep what was found, asking nothing."""
    from launcher.targets.k8s.objects.apis import PYTORCHJOB
    from launcher.targets.k8s.status import _ending

    class Ended(_Kube):
        def list_pods(self, selector: str) -> list[dict]:
            self.asked.append("pods")
            return [{"metadata": {"name": "demo-master-0"}, "status": {"containerStatuses": [
                {"name": "pytorch", "restartCount": 0, "state": {"terminated": {"exitCode": END_EXIT}}}]}}]

    kube = Ended(b"")
    kube.pod_log = lambda name, previous=False, tail=None: b"[ddpjob] stall.action fail: node 1 (w) went silent\n"
    plain = "PyTorchJob demo is failed because 1 Master replica(s) failed."
    first = _ending(kube, "demo", PYTORCHJOB, None, plain)
    assert first == "stalled: node 1 (w) went silent" and kube.asked == ["pods"]
    assert _ending(kube, "demo", PYTORCHJOB, {"state": "FAILED", "message": first}, plain) == first
    assert kube.asked == ["pods"]  # kept: not asked again
    assert _ending(kube, "demo", PYTORCHJOB, {"state": "RUNNING", "message": ""}, plain) == first
