"""The local target under faults of its own processes and its disk: a full $DDPJOB_HOME under the supervisor,
an agent or a node wrapper killed from outside, a worker's child that escapes the job's session and
environment, a stopped supervisor. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from testkit import marked_sweep, stop_leftovers, wait_for

IN_CI = os.environ.get("CI", "").lower() == "true"


def _cannot(reason: str) -> None:
    """Skip with ``reason`` where the machine cannot do what the test needs; under CI, fail."""
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def small_home(ddpjob_home: Path) -> Iterator[Path]:
    """The whole $DDPJOB_HOME (the registry and the run directories) on a real 4 MiB filesystem
    (tmpfs), unmounted after the test's processes stop."""
    if os.geteuid() != 0:
        _cannot("mounting a small tmpfs for $DDPJOB_HOME needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(ddpjob_home)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        _cannot(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield ddpjob_home
    finally:
        stop_leftovers(ddpjob_home)
        subprocess.run(["umount", str(ddpjob_home)], check=False)
        if os.path.ismount(ddpjob_home):  # a process that outlived the stop still holds a file there
            subprocess.run(["umount", "-l", str(ddpjob_home)], check=False)


def fill(path: Path) -> None:
    """Fill the filesystem holding ``path`` to its last byte."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass


STAGE = """
import os, sys, time
marks = os.environ["MARKS"]
open(os.path.join(marks, "started-" + sys.argv[1]), "w").close()
while not os.path.exists(os.path.join(marks, "go-" + sys.argv[1])):
    time.sleep(0.1)
"""


@pytest.mark.real
def test_a_full_disk_does_not_stop_the_supervisor(cli, tmp_path, small_home):
    """$DDPJOB_HOME fills up during the first run of a sweep and stays full past the job's end: the
    supervisor keeps the state in memory, starts the second run, stays until it can write the final
    state (not exit 120 on its unwritable log), and writes every run's true state once there is room
    again. Meanwhile status, list and logs work, read-only, and status says why the state is stale."""
    from launcher.targets.shared import procs

    marks, job_id = marked_sweep(cli, tmp_path, "full", STAGE)
    run_dir = small_home / "runs" / job_id
    wait_for((marks / "started-0").exists, "the first run to start")
    filler = small_home / "filler"
    fill(filler)
    (marks / "go-0").touch()  # the first run ends: its state cannot be written
    wait_for((marks / "started-1").exists, "the second run to start on the full disk")

    def status(saying: str = "") -> dict | None:
        st = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        return st if saying in (st["message"] or "") else None

    stale = wait_for(lambda: status("could not write state.json"), "status to say why the state is stale")
    assert "No space left on device" in stale["message"], stale
    assert job_id in cli("list", check=True).stdout
    cli("logs", job_id, check=True)  # exit 0, no longer 3 (the registry unreadable on a full disk)
    assert not list(run_dir.glob("*.tmp*")), list(run_dir.iterdir())
    (marks / "go-1").touch()  # the job ends on the full disk
    ended = wait_for(lambda: status("the job has ended"), "status to say the job has ended")
    assert "SUCCEEDED" in ended["message"] and ended["state"] == "RUNNING", ended  # not final until written
    supervisor = (ended["handle"]["pid"], ended["handle"]["start"])
    assert procs.alive(*supervisor), "the supervisor exited before it could write the final state"
    filler.unlink()
    done = cli("wait", job_id, "--timeout", "120")
    assert done.returncode == 0 and "SUCCEEDED" in done.stdout, done.stdout + done.stderr
    state = json.loads((run_dir / "state.json").read_text())  # written by the supervisor, not rebuilt by status
    assert [e["state"] for e in state["elements"]] == ["SUCCEEDED", "SUCCEEDED"], state
    assert state["state"] == "SUCCEEDED" and "supervisor was gone" not in (status() or {})["message"], state
    assert not list(run_dir.glob("**/*.tmp*"))


@pytest.mark.real
def test_a_run_on_a_full_disk_is_not_called_not_run_when_the_supervisor_is_gone(cli, tmp_path, small_home):
    """The supervisor is killed while the second run of a sweep goes on on a full disk, whose exit
    records the disk refused: status, reading the nodes' files, says that run ran, not "not run"."""
    marks, job_id = marked_sweep(cli, tmp_path, "full", STAGE)
    wait_for((marks / "started-0").exists, "the first run to start")
    fill(small_home / "filler")
    (marks / "go-0").touch()
    wait_for((marks / "started-1").exists, "the second run to start on the full disk")
    os.kill(json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["handle"]["pid"], signal.SIGKILL)
    (marks / "go-1").touch()
    done = cli("wait", job_id, "--timeout", "120")
    assert done.returncode == 1, done.stdout + done.stderr
    tasks = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["status"]["tasks"]
    assert tasks[1]["message"].startswith("ran, but left no exit record"), tasks


WAITER = """
import os, time
print("waiting", os.environ["RANK"], flush=True)
while True:
    time.sleep(1)
"""


def _start_waiting_job(cli, tmp_path: Path, nodes: int = 2, *options: str) -> tuple[str, dict]:
    (tmp_path / "waiter.py").write_text(WAITER)
    job_id = cli("submit", "-q", "--nodes", str(nodes), *options, "--", "python", "waiter.py", cwd=tmp_path,
                 check=True).stdout.strip()
    wait_for(lambda: cli("logs", job_id).stdout.count("waiting") == nodes, "the workers to start")
    return job_id, json.loads(cli("status", job_id, "-o", "json", check=True).stdout)


@pytest.mark.real
def test_cancel_resumes_a_stopped_supervisor_to_stop_its_job(cli, tmp_path):
    """A supervisor stopped with SIGSTOP (Ctrl-Z) is resumed by cancel, stops its own nodes and
    records the cancel itself, rather than cancel waiting it out and killing it."""
    from launcher.targets.shared import procs

    job_id, data = _start_waiting_job(cli, tmp_path)
    os.kill(data["handle"]["pid"], signal.SIGSTOP)
    proc = cli("cancel", job_id)
    assert proc.returncode == 0 and "CANCELLED" in proc.stdout, proc.stdout + proc.stderr
    assert procs.marked_pids("DDPJOB_JOB_ID", job_id) == []
    state = json.loads((Path(data["run_dir"]) / "state.json").read_text())
    assert [e["state"] for e in state["elements"]] == ["CANCELLED"], state  # written by the supervisor
    assert all(n["exit_code"] is not None for n in state["elements"][0]["nodes"]), state


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.mark.real
@pytest.mark.parametrize("victim", ["agent", "wrapper"])
def test_a_node_process_killed_from_outside_is_named_as_the_cause(cli, tmp_path, victim):
    """SIGKILL to node 1's torchrun agent, or to the ddpjob node wrapper above it: the job fails
    naming that process and the signal, not a worker's ordinary last line (all a killed agent leaves)
    nor the SIGTERM ddpjob sent afterwards to stop the rest. (recovery.max_losses 0: the run is not
    brought back, as it is by default: tests/foundation/test_found_recovery.py.)"""
    job_id, data = _start_waiting_job(cli, tmp_path, 2, "--set", "recovery.max_losses=0")
    state = json.loads((Path(data["run_dir"]) / "state.json").read_text())
    wrapper = state["elements"][0]["nodes"][1]["pid"]
    pid = _children(wrapper)[0] if victim == "agent" else wrapper
    os.kill(pid, signal.SIGKILL)
    done = cli("wait", job_id, "--timeout", "120")
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    message = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)["message"]
    process = "torchrun agent" if victim == "agent" else "ddpjob node wrapper"
    assert f"node 1: its {process} (pid {pid}) was killed by SIGKILL" in message, message
    assert "waiting" not in message and "SIGTERM" not in message, message


ESCAPER = """
import os, subprocess, sys, time
# A child in its own session with an empty environment: no process group, no DDPJOB_JOB_ID.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True, env={},
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(os.environ["ESCAPED"] + ".tmp", "w") as f:
    f.write(str(child.pid))
os.rename(os.environ["ESCAPED"] + ".tmp", os.environ["ESCAPED"])
print("escaped", flush=True)
while not os.environ.get("THEN_EXIT") and not os.path.exists(os.environ["ESCAPED"] + ".go"):
    time.sleep(0.2)
"""


@pytest.mark.real
def test_cancel_stops_a_process_that_left_the_job_session_and_environment(cli, tmp_path):
    """Each node runs in a cgroup of its own: cancel stops a worker's child that started its own
    session with an empty environment, which neither the process group nor the job's marker finds."""
    from launcher.targets.local.job import cgroups
    from launcher.targets.shared import procs

    if cgroups.make_job("probe-00000")[0] is None:
        _cannot(f"no writable cgroup v2 here: {cgroups.make_job('probe-00000')[1]}")
    cgroups.remove(cgroups.make_job("probe-00000")[0] or "")
    (tmp_path / "escaper.py").write_text(ESCAPER)
    escaped = tmp_path / "escaped"
    job_id = cli("submit", "-q", "--set", f"env.ESCAPED={escaped}", "--", "python", "escaper.py", cwd=tmp_path,
                 check=True).stdout.strip()
    pid = int(wait_for(lambda: escaped.exists() and escaped.read_text(), "the worker's child to escape"))
    started = procs.start_time(pid)
    try:
        assert pid not in procs.marked_pids("DDPJOB_JOB_ID", job_id)  # the marker cannot see it
        proc = cli("cancel", job_id)
        assert proc.returncode == 0 and "CANCELLED" in proc.stdout, proc.stdout + proc.stderr
        assert not procs.alive(pid, started), f"process {pid} escaped the cancel"
        state = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        assert not os.path.exists(json.loads((Path(state["run_dir"]) / "state.json").read_text())["cgroup"])
    finally:
        if procs.alive(pid, started):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.real
def test_a_job_that_ends_leaves_nothing_running_and_says_what_it_stopped(cli, tmp_path):
    """A worker starts a daemon (its own session, an empty environment) and exits 0: the job ends
    SUCCEEDED, the daemon is stopped with it (its cgroup emptied and removed), and status says so."""
    from launcher.targets.local.job import cgroups
    from launcher.targets.shared import procs

    if cgroups.make_job("probe-00000")[0] is None:
        _cannot(f"no writable cgroup v2 here: {cgroups.make_job('probe-00000')[1]}")
    cgroups.remove(cgroups.make_job("probe-00000")[0] or "")
    (tmp_path / "escaper.py").write_text(ESCAPER)
    escaped = tmp_path / "escaped"
    job_id = cli("submit", "-q", "--set", f"env.ESCAPED={escaped}", "--set", "env.THEN_EXIT=1", "--", "python",
                 "escaper.py", cwd=tmp_path, check=True).stdout.strip()
    pid = int(wait_for(lambda: escaped.exists() and escaped.read_text(), "the worker's child to escape"))
    started = procs.start_time(pid)
    try:
        done = cli("wait", job_id, "--timeout", "120")
        assert done.returncode == 0 and "SUCCEEDED" in done.stdout, done.stdout + done.stderr
        assert not procs.alive(pid, started), f"process {pid} outlived its job"
        state = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        assert f"1 process(es) the job left running when it ended (pid {pid} python" in state["status"]["message"], state
        assert not os.path.exists(json.loads((Path(state["run_dir"]) / "state.json").read_text())["cgroup"])
    finally:
        if procs.alive(pid, started):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.real
def test_a_job_whose_supervisor_was_killed_leaves_nothing_running_once_it_ends(cli, tmp_path):
    """The supervisor SIGKILLed while a worker's daemon runs (its own session, an empty environment); the
    worker then exits 0. The first status that finds the job ended does what the supervisor would have:
    the daemon is stopped, the cgroup removed, and the message says what was stopped."""
    from launcher.targets.local.job import cgroups
    from launcher.targets.shared import procs

    if cgroups.make_job("probe-00000")[0] is None:
        _cannot(f"no writable cgroup v2 here: {cgroups.make_job('probe-00000')[1]}")
    cgroups.remove(cgroups.make_job("probe-00000")[0] or "")
    (tmp_path / "escaper.py").write_text(ESCAPER)
    escaped = tmp_path / "escaped"
    job_id = cli("submit", "-q", "--set", f"env.ESCAPED={escaped}", "--", "python", "escaper.py", cwd=tmp_path,
                 check=True).stdout.strip()
    pid = int(wait_for(lambda: escaped.exists() and escaped.read_text(), "the worker's child to escape"))
    started = procs.start_time(pid)
    try:
        data = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
        os.kill(data["handle"]["pid"], signal.SIGKILL)  # the supervisor
        (tmp_path / "escaped.go").touch()  # the worker exits 0; its node wrapper records it
        done = cli("wait", job_id, "--timeout", "120")
        assert "SUCCEEDED" in done.stdout and "the supervisor was gone" in done.stdout, done.stdout + done.stderr
        assert not procs.alive(pid, started), f"process {pid} outlived its job"
        assert f"1 process(es) the job left running when it ended (pid {pid} python" in done.stdout, done.stdout
        state = json.loads((Path(data["run_dir"]) / "state.json").read_text())
        assert not os.path.exists(state["cgroup"])
        assert "already ended" in cli("cancel", job_id).stdout
    finally:
        if procs.alive(pid, started):
            os.kill(pid, signal.SIGKILL)


def test_cancel_says_what_it_cannot_reach_where_no_cgroup_held_the_job(tmp_path):
    """Where the supervisor could make no cgroup (state.json says why), cancel's output says that a
    process in a session of its own with an empty environment may have escaped; with one, nothing."""
    from launcher.targets.local.payload import LocalHandle
    from launcher.targets.local.target import LocalTarget

    handle = LocalHandle(job_id="j-00000", run_dir=str(tmp_path))
    (tmp_path / "state.json").write_text(json.dumps({"cgroup": None, "cgroup_unavailable": "no cgroup v2 here"}))
    note = LocalTarget().cancel_note(handle)
    assert note is not None and "(no cgroup v2 here)" in note and "may still run" in note
    (tmp_path / "state.json").write_text(json.dumps({"cgroup": "/sys/fs/cgroup/x", "cgroup_unavailable": None}))
    assert LocalTarget().cancel_note(handle) is None


@pytest.mark.real
def test_torchrun_failing_before_its_ranks_start_is_the_root_cause(cli, tmp_path):
    """A spec env torchrun itself rejects (LOGLEVEL=debug: not a level name) fails every node's
    torchrun before any rank starts: that error is the cause, on the node that had it, not "node 1
    failed"; a node stopped as it failed the same way shows its own error beside the stop's code."""
    (tmp_path / "x.py").write_text("print('never printed')\n")
    job_id = cli("submit", "-q", "--nodes", "2", "--set", "env.LOGLEVEL=debug", "--", "python", "x.py",
                 cwd=tmp_path, check=True).stdout.strip()
    done = cli("wait", job_id, "--timeout", "120")
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    st = json.loads(cli("status", job_id, "-o", "json", check=True).stdout)
    cause = "torchrun failed before any rank started: ValueError: Unknown level: 'debug'"
    assert cause in st["message"] and cause in st["status"]["tasks"][0]["message"], st["message"]
    for n in st["status"]["tasks"][0]["nodes"]:
        # A node that reached the error shows it (its exit code, or its own error beside the stop's
        # code); one the stop's SIGTERM reached first (still importing torch) was merely stopped.
        if "Unknown level: 'debug'" in Path(n["log"]).read_text():
            assert n["exit_code"] == 1 or "Unknown level: 'debug'" in n.get("error", ""), n


TORCHRUN_CRASH = """\
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File ".../torch/distributed/run.py", line 442, in <module>
    raise ValueError("Unknown level: %r" % level)
ValueError: Unknown level: 'debug'
"""
WORKER_FAILED = """\
[default0]:Traceback (most recent call last):
[default0]:ValueError: the user's own
Traceback (most recent call last):
  File ".../torch/distributed/run.py", line 892, in main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_torchrun_own_error_is_told_from_a_worker_failure(tmp_path):
    """torchrun's own traceback names the cause; the one it raises because a worker failed does not.
    A node stopped by SIGTERM as it failed the same way gets that error in its record."""
    from launcher.targets.local.job.staterecord import StateNode
    from launcher.targets.shared.rootcause import agent_error, own_errors

    assert agent_error(TORCHRUN_CRASH.splitlines()) == "ValueError: Unknown level: 'debug'"
    assert agent_error(WORKER_FAILED.splitlines()) is None
    assert agent_error(["torchrun: error: argument --nnodes: invalid value"]) == \
        "torchrun: error: argument --nnodes: invalid value"
    logs = [tmp_path / "node-0.log", tmp_path / "node-1.log", tmp_path / "node-2.log"]
    logs[0].write_text(TORCHRUN_CRASH)
    logs[1].write_text(TORCHRUN_CRASH)
    logs[2].write_text(WORKER_FAILED)
    records = [StateNode(0, None, str(logs[0]), 1), StateNode(1, None, str(logs[1]), -15), StateNode(2, None, str(logs[2]), -15)]
    message = own_errors(records, [str(p) for p in logs], 0, "node 0: torchrun failed: ValueError: Unknown level: 'debug'")
    assert message.endswith("(node 1 failed the same way)"), message
    assert records[1].error == "ValueError: Unknown level: 'debug'" and records[2].error is None, records
