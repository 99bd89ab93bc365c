"""Submit under faults: a missing script, a refused submit, Ctrl-C at any moment of the hand-over."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import ctrl_c_raises, sigint_default, wait_for

REPO = Path(__file__).resolve().parents[2]


def jobs_in_registry(cli) -> list[dict]:
    return json.loads(cli("list", "-o", "json", check=True).stdout)


def test_missing_script_is_refused_before_anything_is_recorded(cli, tmp_path):
    proc = cli("submit", "--nodes", "2", "--", "python", "/nonexistent/x.py", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "<command line>: command[1]: script /nonexistent/x.py does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert jobs_in_registry(cli) == []


def test_missing_script_or_module_in_a_spec_names_file_and_line(cli, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: job\ncommand:\n  - python\n  - train.py\n")
    proc = cli("submit", str(spec), cwd=tmp_path)
    assert proc.returncode == 2 and f"{spec}:4:5: command[1]: script {tmp_path}/train.py does not exist" in proc.stderr
    spec.write_text("name: job\ncommand: [python, -m, nosuchpkg.train]\n")
    proc = cli("submit", str(spec), "--target", "slurm", cwd=tmp_path)
    assert proc.returncode == 2 and "module 'nosuchpkg.train' not found" in proc.stderr, proc.stderr
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec.write_text("name: job\ncommand: [python, train.py]\n")
    assert cli("submit", str(spec), "--dry-run", cwd=tmp_path).returncode == 0
    assert jobs_in_registry(cli) == []


@pytest.mark.real
def test_installed_modules_and_no_preflight_pass(cli, tmp_path):
    ok = cli("submit", "-q", "--", "python", "-m", "json.tool", "--help", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    skipped = cli("submit", "-q", "--no-preflight", "--", "python", "/nonexistent/x.py", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr
    for job_id in (ok.stdout.strip(), skipped.stdout.strip()):
        cli("cancel", job_id, check=True)


def test_a_refused_submit_is_not_a_job(cli, tmp_path, ddpjob_home):
    proc = cli("submit", str(REPO / "jobs" / "quickstart.yaml"), "--target", "k8s",
               env={"KUBECONFIG": str(tmp_path / "none")})
    assert proc.returncode == 3 and "kubeconfig" in proc.stderr
    assert jobs_in_registry(cli) == []
    assert not any((ddpjob_home / "runs").glob("*")) if (ddpjob_home / "runs").exists() else True


@pytest.mark.real
def test_ctrl_c_at_any_moment_of_submit(tmp_path, ddpjob_home):
    """Either nothing is submitted and nothing recorded, or the id is printed with how to follow and
    cancel it; exit 130 either way (0 when the submit had finished before the signal)."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    argv = [sys.executable, "-m", "launcher", "submit", "-q", "--", "python", "sleep.py"]
    # How long one whole submit takes on this machine (0.2 s to 1 s): the signals are spread over it,
    # so that they land in every phase on a fast machine as on a slow one.
    # A signal while the interpreter itself starts, or while runpy finds and compiles the package's
    # __main__, is Python's business ("Fatal Python error: init_import_site", a traceback from
    # <frozen runpy>): the trials start after that, at the slowest of three such starts.
    starts = []
    for _ in range(3):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import launcher.cli.entry"], check=True)
        starts.append(time.monotonic() - start)
    python_start = max(starts)
    start = time.monotonic()
    first = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=True)
    took = time.monotonic() - start - python_start
    subprocess.run([sys.executable, "-m", "launcher", "cancel", first.stdout.strip()], capture_output=True, check=True)
    import sqlite3

    with sqlite3.connect(ddpjob_home / "registry.db") as conn:
        conn.execute("DELETE FROM jobs")
    rng = random.Random(7)
    seen = {"nothing": 0, "submitted": 0}
    for trial in range(8):
        p = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_default)  # noqa: PLW1509 (no threads here) a Ctrl-C stops it, even under nohup
        time.sleep(python_start + took * (trial + rng.random()) / 8)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        records = json.loads(subprocess.run([sys.executable, "-m", "launcher", "list", "-o", "json"],
                                            capture_output=True, text=True, check=True).stdout)
        assert "Aborted!" not in err and "Traceback" not in err, err
        if p.returncode == 0:  # finished before the signal: an ordinary submit
            job_id = out.strip()
        elif "nothing was submitted" in err or p.returncode == -signal.SIGINT or (
                p.returncode == 130 and "ddpjob cancel " not in err):  # Ctrl-C while click was parsing
            # -2: the signal came before ddpjob's code ran (Python starting); a shell shows 130 too.
            assert p.returncode in (130, -signal.SIGINT) and records == [], (err, records)
            seen["nothing"] += 1
            continue
        else:
            assert p.returncode == 130 and "ddpjob cancel " in err, err
            job_id = err.split("ddpjob cancel ")[1].split()[0]
            seen["submitted"] += 1
        assert [r["id"] for r in records] == [job_id], records
        full = json.loads(subprocess.run([sys.executable, "-m", "launcher", "status", job_id, "-o", "json"],
                                         capture_output=True, text=True, check=True).stdout)
        assert full["handle"], full  # recorded with its handle: followable and cancellable
        subprocess.run([sys.executable, "-m", "launcher", "cancel", job_id], capture_output=True, check=True)
        subprocess.run([sys.executable, "-m", "launcher", "list"], capture_output=True, check=True)
        # start the next trial from an empty registry
        with sqlite3.connect(ddpjob_home / "registry.db") as conn:
            conn.execute("DELETE FROM jobs")
    assert seen["nothing"] + seen["submitted"] >= 1, seen


@pytest.mark.parametrize("_", [0])
def testdeferred_interrupt_holds_ctrl_c_until_the_end_of_the_window(_):
    from launcher.service.jobs import deferred_interrupt

    with ctrl_c_raises():  # as in ddpjob, whatever pytest was started with
        with deferred_interrupt() as caught:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert caught == [signal.SIGINT]  # held, not raised inside the window
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the default handler is back
            time.sleep(0.05)


def test_a_ctrl_c_during_the_first_validation_stops_ddpjob_as_anywhere_else():
    """Pydantic builds the spec's validators in Rust on first use and turns a KeyboardInterrupt
    raised there into a SchemaError ("internal error", exit 70); the validation holds Ctrl-C and
    raises it after, failing validation or not."""
    from launcher.core.interrupts import interrupt_after

    for inside in (lambda: None, lambda: int("not a number")):
        # ctrl_c_raises: Python's handler, as in ddpjob, whatever pytest was started with
        with ctrl_c_raises(), pytest.raises(KeyboardInterrupt), interrupt_after():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # held: nothing is raised in here
            inside()
    with interrupt_after():
        pass  # no Ctrl-C: nothing raised
    got = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        with interrupt_after():  # a program with its own handler (launcher.api) gets the Ctrl-C there
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert got == []
    finally:
        signal.signal(signal.SIGINT, previous)
    assert got == [signal.SIGINT]


def test_a_ctrl_c_python_would_drop_is_delivered_again():
    """A Ctrl-C that lands in a weakref callback (the import system has some) is printed by Python
    as "Exception ignored" and dropped; the ddpjob process gets it again, where it stops ddpjob."""
    code = """
import sys, time, weakref
from launcher.cli import entry
entry.interrupts_never_lost()
class A: pass
a = A()
r = weakref.ref(a, lambda _: (_ for _ in ()).throw(KeyboardInterrupt))
try:
    del a
    time.sleep(60)  # a blocking wait ends too
    print("lost")
except KeyboardInterrupt:
    print("delivered")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         preexec_fn=sigint_default)  # Python's Ctrl-C handler, even under nohup
    assert (out.stdout, out.stderr) == ("delivered\n", ""), out


WAITER = """
import os, pathlib, time
go = pathlib.Path(os.environ["GO_FILE"])
print("waiting", os.environ["RANK"], flush=True)
while not go.exists():
    time.sleep(0.1)
print("done", os.environ["RANK"], flush=True)
"""


def _start_waiting_job(cli, tmp_path: Path) -> tuple[str, Path, dict]:
    (tmp_path / "waiter.py").write_text(WAITER)
    go = tmp_path / "go"
    job_id = cli("submit", "-q", "--nodes", "2", "--set", f"env.GO_FILE={go}", "--", "python", "waiter.py",
                 cwd=tmp_path, check=True).stdout.strip()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if cli("logs", job_id).stdout.count("waiting") == 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the workers did not start")
    data = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
    return job_id, go, data


@pytest.mark.real
def test_a_killed_supervisor_does_not_turn_a_good_run_into_failed(cli, tmp_path):
    job_id, go, data = _start_waiting_job(cli, tmp_path)
    os.kill(data["handle"]["pid"], signal.SIGKILL)  # the supervisor, as the OOM killer would

    def supervisor_gone() -> dict | None:
        st = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        return st if "is gone" in (st["message"] or "") else None

    status = wait_for(supervisor_gone, "status to see that the supervisor is gone", timeout=60)
    assert status["state"] == "RUNNING" and "supervisor" in status["message"] and "is gone" in status["message"]
    follower = subprocess.Popen([sys.executable, "-m", "launcher", "logs", job_id, "-f"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    assert follower.poll() is None  # logs -f follows a job whose supervisor is gone
    go.write_text("go")
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0 and out.count("done") == 2, (out, err)
    end = cli("wait", job_id, "--timeout", "60")
    assert end.returncode == 0 and "SUCCEEDED" in end.stdout and "exit records" in end.stdout, end.stdout
    # The supervisor that would have removed the job's cgroups is gone: status removed them.
    cgroup = json.loads((Path(data["run_dir"]) / "state.json").read_text()).get("cgroup")
    assert cgroup is None or not os.path.exists(cgroup), cgroup


@pytest.mark.real
def test_cancel_stops_a_job_whose_supervisor_was_killed(cli, tmp_path):
    from launcher.targets.shared import procs

    job_id, _go, data = _start_waiting_job(cli, tmp_path)
    os.kill(data["handle"]["pid"], signal.SIGKILL)
    wait_for(lambda: not procs.alive(data["handle"]["pid"], data["handle"].get("start")), "the supervisor to end",
             timeout=30)
    assert procs.marked_pids("DDPJOB_JOB_ID", job_id)  # agents and workers run on
    proc = cli("cancel", job_id)
    assert proc.returncode == 0 and "CANCELLED" in proc.stdout, proc.stdout + proc.stderr
    assert procs.marked_pids("DDPJOB_JOB_ID", job_id) == []
    assert "CANCELLED" in cli("status", job_id, check=True).stdout


RANKS_OK = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
print("rank", dist.get_rank(), "of", dist.get_world_size(), "port", os.environ["MASTER_PORT"], flush=True)
dist.destroy_process_group()
"""


@pytest.mark.real
def test_a_port_taken_before_the_rendezvous_is_replaced(cli, tmp_path):
    """Another program binds the job's port between the choice and torchrun's bind: the supervisor
    starts the nodes again on a new port, says so in the log, and the job succeeds."""
    import socket

    (tmp_path / "ranks.py").write_text(RANKS_OK)
    for _ in range(3):  # the squatter has to win the race against torchrun's start (~2 s of imports)
        job_id = cli("submit", "-q", "--nodes", "2", "--", "python", "ranks.py", cwd=tmp_path, check=True).stdout.strip()
        port = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["port"]
        squatter = socket.socket()
        try:
            squatter.bind(("127.0.0.1", port))
        except OSError:
            squatter.close()
            cli("cancel", job_id)
            continue
        squatter.listen(16)
        try:
            done = cli("wait", job_id, "--timeout", "240")
            logs = cli("logs", job_id, check=True).stdout
        finally:
            squatter.close()
        assert done.returncode == 0 and "SUCCEEDED" in done.stdout, done.stdout + logs
        assert f"rendezvous port {port} was taken by another program" in logs, logs
        record = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        new_port = record["port"]
        assert new_port != port and logs.count(f"port {new_port}") >= 2  # both ranks met there
        # The plan files show the port the job used, not the one it lost (the registry's record,
        # above, came through the service's port command: the supervisor never opens the registry).
        run_dir = Path(record["run_dir"])
        shown = (run_dir / "plan.txt").read_text()
        assert f"--master-port {new_port}" in shown and f"--master-port {port}" not in shown
        assert json.loads((run_dir / "plan.json").read_text())["port"] == new_port
        return
    pytest.skip("torchrun bound the port before the test could take it, three times")


def test_the_port_search_tries_every_port_of_the_range(monkeypatch):
    """Whatever the random start, the one port neither busy nor bound is found; none left: an error
    that says how to fix it."""
    import socket

    from launcher.core.errors import TargetUnavailable
    from launcher.targets.local import ports as local

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    ports = range(base, base + 8)
    monkeypatch.setattr(local, "PORT_RANGE", ports)
    holders = []
    try:
        for port in ports[1:4]:  # bound by another program: the search must step over them
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()  # somebody else has it: just as good
            else:
                holders.append(s)
        for free in (ports[0], ports[-1]):  # the first and the last of the range
            busy = {p for p in (ports[0], *ports[4:]) if p != free}  # held by other ddpjob jobs
            for seed in range(16):  # every starting point, and then some
                random.seed(seed)
                assert local.pick_port(busy) == free
            with pytest.raises(TargetUnavailable, match="set master_port"):
                local.pick_port(busy | {free})
    finally:
        for s in holders:
            s.close()


@pytest.mark.real  # runs a job under the supervisor
def test_a_state_file_that_cannot_be_written_does_not_fail_a_good_run(tmp_path):
    """As on a full disk: the supervisor cannot write state.json (here it is a directory), runs the
    job anyway, and status reads the finished run from the nodes' exit records: SUCCEEDED."""
    from launcher.spec.load import load_spec
    from launcher.targets.base import PlanContext
    from launcher.targets.local.target import LocalHandle, LocalTarget
    from launcher.targets.shared.files import to_json, write_json

    (tmp_path / "ok.py").write_text("print('fine')\n")
    run_dir = tmp_path / "run"
    loaded = load_spec(None, base={"name": "full", "command": ["python", "ok.py"], "nodes": 2})
    ctx = PlanContext(job_id="full-abcde", run_dir=str(run_dir), port=None, cpu_count=2, cwd=str(tmp_path),
                      python=sys.executable)
    target = LocalTarget()
    plan = target.plan(loaded, PlanContext(**{**ctx.__dict__, "port": target.pick_port(set())}))
    run_dir.mkdir()
    write_json(run_dir / "plan.json", to_json(plan.payload))
    (run_dir / "state.json").mkdir()  # every write of the state file fails
    sup = subprocess.run([sys.executable, "-m", "launcher.targets.local.job.supervisor", str(run_dir)],
                         env={**os.environ, "DDPJOB_JOB_ID": "full-abcde"}, capture_output=True, text=True,
                         timeout=240)
    assert sup.returncode == 0 and "could not write state.json" in sup.stderr, sup.stderr
    gone = 2**22 + 1  # above Linux's largest pid: a supervisor that no longer runs
    status = target.status(LocalHandle("full-abcde", str(run_dir), pid=gone, start=None))
    assert status.state.value == "SUCCEEDED" and "exit records" in status.message, status


def test_the_node_wrapper_records_how_its_agent_ended(tmp_path):
    """The wrapper's record is the job's truth when the supervisor is gone: an exit code, a program
    that cannot start (127, with why), and a stop signal passed on to the agent (no process left)."""
    from launcher.targets.local.job import node
    from launcher.targets.shared import procs

    def run(argv: list[str], name: str) -> tuple[int, dict | None]:
        record = str(tmp_path / f"{name}.exit.json")
        proc = subprocess.run(node.command(sys.executable, record, argv), capture_output=True, text=True, timeout=60)
        return proc.returncode, node.read_record(record)

    code, record = run(["sh", "-c", "exit 3"], "three")
    assert code == 3 and record["exit_code"] == 3 and record["signal"] is None
    code, record = run(["/nonexistent/agent"], "missing")
    assert code == 127 and record["exit_code"] == 127 and "No such file" in record["error"]

    record_path = str(tmp_path / "stopped.exit.json")
    pid_file = tmp_path / "agent.pid"
    wrapper = subprocess.Popen(node.command(sys.executable, record_path,
                                            ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 600"]))
    agent = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the agent to start"))
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=30) == 128 + signal.SIGTERM
    assert node.read_record(record_path)["signal"] == "SIGTERM"
    assert not procs.alive(agent, None), "the agent outlived its wrapper"


def test_an_ignored_ctrl_c_stays_ignored_over_the_held_steps():
    """Started with SIGINT ignored (nohup, a background job), a Ctrl-C during the submit window is
    ignored like anywhere else, not held and turned into exit 130 afterwards."""
    from launcher.core.interrupts import deferred_interrupt, interrupt_after

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred_interrupt() as caught:
            signal.raise_signal(signal.SIGINT)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert caught == []
        with interrupt_after():
            signal.raise_signal(signal.SIGINT)  # nothing is raised after the step either
    finally:
        signal.signal(signal.SIGINT, previous)
