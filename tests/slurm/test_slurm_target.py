"""The Slurm target against the project's real Slurm cluster (slurm/cluster.sh; fixture slurm_cluster).

Nodes n1 and n2 run on this machine, so the job folder may be any local directory. Every test
goes through the real ``ddpjob`` command line in a subprocess, with its own DDPJOB_HOME.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from testkit import wait_for_no_job_processes

pytestmark = [pytest.mark.slurm, pytest.mark.real]

REPO = Path(__file__).resolve().parents[2]
RECORD = "tests/slurm/rank_record.py"


def write_spec(tmp_path: Path, name: str, command: list[str], **extra: Any) -> Path:
    import yaml

    spec = {"name": name, "workdir": str(REPO), "command": command, "nodes": 2, "procs_per_node": 1,
            "slurm": {"folder": str(tmp_path / "slurm"), "time": "10", "signal_delay_s": 15, **extra.pop("slurm", {})}}
    spec.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def submit(cli: Any, *args: str) -> str:
    proc = cli("submit", *args, "--target", "slurm", "-q", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def status(cli: Any, job_id: str) -> dict[str, Any]:
    proc = cli("status", job_id, "-o", "json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def wait_for(cli: Any, job_id: str, states: set[str], timeout: float = 240) -> dict[str, Any]:
    """Poll ``ddpjob status`` (with backoff) until the target reports one of ``states``."""
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        data = status(cli, job_id)
        if data["status"] and data["status"]["state"] in states:
            return data
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} never reached {states}: {json.dumps(data['status'], indent=1)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 4.0)


def records(output_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(output_dir.glob("rank-*.json"))]


def rendered_script(cli: Any, spec: Path, job_id: str, *sets: str) -> str:
    """The sbatch script section of ``ddpjob render`` for ``spec``, with the real job id filled in."""
    proc = cli("render", str(spec), "--target", "slurm", *sets, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.split("#### sbatch script: ", 1)[1].split("\n", 1)[1].split("#### end of sbatch script")[0]
    name = job_id.rsplit("-", 1)[0]
    return text.replace(f"{name}-xxxxx", job_id)


@pytest.fixture(autouse=True)
def _slurm_env(slurm_cluster, monkeypatch):
    """Point every Slurm command (ours, and the ddpjob subprocesses') at the test cluster."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


# --------------------------------------------------------------------------- tests

def test_two_node_job_with_hostile_arguments(slurm_cluster, cli, tmp_path):
    """2 nodes, one torchrun each, one rendezvous; hostile strings arrive literally; render == submitted."""
    marker = f"/tmp/ddpjob-pwned-{uuid.uuid4().hex[:8]}"
    hostile = [f"$(touch {marker})", f"'; touch {marker}; '", f"`touch {marker}`", 'a"b;c|d&', "a$$b", "$local_rank"]
    spec = write_spec(tmp_path, "two", ["python", RECORD, "--allreduce", *hostile],
                      env={"NOTE": f"$(touch {marker})"},
                      slurm={"sbatch": {"comment": f"$(touch {marker}); echo 'x'"}})
    proc = cli("submit", str(spec), "--target", "slurm", "-f", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"Submitted (\S+) to slurm", proc.stdout).group(1)  # type: ignore[union-attr]
    data = status(cli, job_id)
    assert data["state"] == "SUCCEEDED" and data["status"]["state"] == "SUCCEEDED"
    handle = data["handle"]
    out = Path(handle["job_dir"]) / "output"
    recs = records(out)
    assert [r["rank"] for r in recs] == [0, 1]
    assert {r["world_size"] for r in recs} == {2}
    assert {r["host"] for r in recs} == {"n1", "n2"}
    first = slurm_cluster.addresses.get("n1", "127.0.77.1")  # n1's address, resolved on the nodes
    assert len({r["master"] for r in recs}) == 1 and recs[0]["master"].startswith(f"{first}:")
    assert {r["allreduce_sum"] for r in recs} == {1.0}
    assert all(r["args"] == ["--allreduce", *hostile] for r in recs)
    assert not Path(marker).exists()
    # Render == submit: the file submitit wrote and sbatch ran is the rendered script.
    submitted = Path(handle["submission_file"]).read_text()
    assert submitted == rendered_script(cli, spec, job_id)
    assert submitted in (Path(handle["run_dir"]) / "plan.txt").read_text()
    # The comment reached Slurm literally.
    sc = subprocess.run(["scontrol", "show", "job", handle["slurm_job_id"]], capture_output=True, text=True, timeout=30)
    assert f"Comment=$(touch {marker}); echo 'x'" in sc.stdout, sc.stdout
    # Logs carry node and rank prefixes.
    logs = cli("logs", job_id, "--rank", "1", timeout=60).stdout
    assert "[node1 rank1] rank 1 of 2 on n2" in logs and "rank0" not in logs
    nodes = data["status"]["tasks"][0]["nodes"]
    assert {n["host"] for n in nodes} == {"n1", "n2"} and {n["exit_code"] for n in nodes} == {0}


def test_quickstart_two_nodes(slurm_cluster, cli, tmp_path):
    """The README's command, unchanged but for the job folder: the reference trainer on 2 nodes."""
    proc = cli("submit", "jobs/quickstart.yaml", "--target", "slurm", "--nodes", "2", "-f",
               "--set", f"slurm.folder={tmp_path}/slurm", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"Submitted (\S+) to slurm", proc.stdout).group(1)  # type: ignore[union-attr]
    data = status(cli, job_id)
    summary = json.loads((Path(data["handle"]["job_dir"]) / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 96 and not summary["preempted"]
    nodes = data["status"]["tasks"][0]["nodes"]
    assert sorted(n["host"] for n in nodes) == ["n1", "n2"] and len({n["rendezvous"] for n in nodes}) == 1
    assert "[node0 rank0] done: 96 steps" in proc.stdout


def test_sweep_is_one_array(slurm_cluster, cli, tmp_path):
    job_id = submit(cli, "jobs/sweep.yaml", "--set", f"slurm.folder={tmp_path}/slurm", "--set", f"workdir={REPO}",
                    "--set", "sweep.seed=[7]", "--set", f"command=[python, {RECORD}, --lr, '{{lr}}', --seed, '{{seed}}']")
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    handle = data["handle"]
    sid = handle["slurm_job_id"]
    tasks = data["status"]["tasks"]
    assert [t["native_id"] for t in tasks] == [f"{sid}_0", f"{sid}_1"]
    assert [t["params"] for t in tasks] == [{"lr": "0.1", "seed": "7"}, {"lr": "0.01", "seed": "7"}]
    for i, lr in enumerate(["0.1", "0.01"]):
        recs = records(Path(handle["job_dir"]) / "output" / f"sweep-{i}")
        assert [r["rank"] for r in recs] == [0, 1] and {r["host"] for r in recs} == {"n1", "n2"}
        assert all(r["args"] == ["--lr", lr, "--seed", "7"] and r["sweep_index"] == str(i) for r in recs)
        assert {r["slurm_job_id"] is not None and r["array_task"] for r in recs} == {str(i)}
    # One array: one submission script, one Slurm job id for both runs.
    assert len(list(Path(handle["job_dir"]).glob("*_submission.sh"))) == 1
    text = cli("status", job_id, timeout=60).stdout
    assert f"task 0 [{sid}_0]: SUCCEEDED (lr=0.1 seed=7)" in text and f"task 1 [{sid}_1]: SUCCEEDED" in text
    logs = cli("logs", job_id, "--task", "1", timeout=60).stdout
    assert "[task1 node0 rank0]" in logs and "[task1 node1 rank1]" in logs and "task0" not in logs
    bad = cli("logs", job_id, "--task", "5", timeout=60)
    assert bad.returncode == 2 and "--task 5: " in bad.stderr and "valid: 0..1" in bad.stderr, bad.stderr


def test_two_jobs_at_once_use_different_ports(slurm_cluster, cli, tmp_path):
    ids = []
    for name in ("conc-a", "conc-b"):
        (tmp_path / name).mkdir()
        spec = write_spec(tmp_path / name, name, ["python", RECORD, "--allreduce", "--sleep", "4"])
        ids.append(submit(cli, str(spec)))
    datas = [wait_for(cli, j, {"SUCCEEDED", "FAILED", "CANCELLED"}) for j in ids]
    assert [d["status"]["state"] for d in datas] == ["SUCCEEDED", "SUCCEEDED"]
    recs = [records(Path(d["handle"]["job_dir"]) / "output") for d in datas]
    masters = [r[0]["master"] for r in recs]
    assert masters[0] != masters[1] and all(len({x["master"] for x in r}) == 1 for r in recs)
    # They really overlapped on the same nodes: both ran on n1 and n2.
    assert all({x["host"] for x in r} == {"n1", "n2"} for r in recs)


@pytest.mark.parametrize("accounting", ["on", "off"])
def test_cancel_running_job(slurm_cluster, cli, tmp_path, accounting, request, ddpjob_home):
    if accounting == "off":
        _wait_until_cluster_is_quiet(slurm_cluster)  # switching restarts the daemons: no jobs in flight
        slurm_cluster.set_accounting(False)
        request.addfinalizer(lambda: slurm_cluster.set_accounting(True))
        assert slurm_cluster.run("sacct", "-j", "1", check=False).returncode != 0  # really off
    spec = write_spec(tmp_path, "cancel", ["python", RECORD, "--sleep", "300"])
    job_id = submit(cli, str(spec))
    wait_for(cli, job_id, {"RUNNING"}, timeout=120)
    proc = cli("cancel", job_id, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = wait_for(cli, job_id, {"CANCELLED"}, timeout=60)  # fails the test if the job is not stopped by then
    assert data["state"] == "CANCELLED" and data["status"]["tasks"][0]["state"] == "CANCELLED"
    if accounting == "off":
        assert "sacct" not in data["status"]["details"]["source"]
    assert cli("cancel", job_id, timeout=60).returncode == 0  # safe to repeat
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel")


def test_failing_rank_fails_the_job_with_its_cause(slurm_cluster, cli, tmp_path):
    """Rank 1 exits 3: the job is FAILED, says which rank and code, and node 0 does not wait out
    torchrun's 5-minute exit barrier (srun --kill-on-bad-exit). Nor does node 1's runner wait out
    recovery.lost_after (30 s) for a loss that is not coming: the first node hears every node, so the
    program failed by itself (it waited 36 s)."""
    stamp = tmp_path / "failed-at"
    spec = write_spec(tmp_path, "fail", ["python", "-c", "import os, sys, time; one = os.environ['RANK'] == '1'; "
                                         f"one and open({str(stamp)!r}, 'w').write(str(time.time())); "
                                         "sys.exit(3 if one else 0)"])
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=150)
    took = time.time() - float(stamp.read_text())
    assert data["status"]["state"] == "FAILED" and data["state"] == "FAILED"
    assert took < 30, f"the job was seen FAILED {took:.0f} s after rank 1 exited"
    assert "rank 1 exited with code 3" in data["status"]["message"], data["status"]["message"]
    shown, verbose = cli("logs", job_id).stdout, cli("logs", job_id, "--verbose").stdout
    assert "ChildFailedError" in verbose and "Root Cause (first observed failure)" in verbose  # in the files
    assert "Root Cause (first observed failure)" not in shown and "torch/distributed/elastic" not in shown
    assert "torchrun stopped: ChildFailedError" in shown


RAISER = """
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1)
    raise ValueError("bad batch on rank 1")
dist.barrier()  # rank 0 waits; it dies in gloo once rank 1 is gone
"""


def test_the_first_failure_is_the_root_cause(slurm_cluster, cli, tmp_path):
    """Rank 1 raises while rank 0 waits in a collective: status names rank 1 and its ValueError,
    not rank 0's gloo error that followed (it used to, 3 runs out of 3)."""
    script = tmp_path / "raiser.py"
    script.write_text(RAISER)
    spec = write_spec(tmp_path, "raiser", ["python", str(script)])
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    message = data["status"]["message"]
    assert data["status"]["state"] == "FAILED" and "ValueError" in message and "bad batch on rank 1" in message, message
    assert message.startswith("node 1 ") and "rank 1" in message, message


def test_sbatch_refusal_is_reported(slurm_cluster, cli, tmp_path):
    spec = write_spec(tmp_path, "refused", ["python", RECORD], slurm={"partition": "no-such-partition"})
    proc = cli("submit", str(spec), "--target", "slurm", timeout=120)
    assert proc.returncode == 3
    assert "sbatch refused the job" in proc.stderr and "partition" in proc.stderr
    assert proc.stderr.count("Invalid partition name") == 1  # submitit's own print is not repeated
    assert json.loads(cli("list", "-o", "json", timeout=60).stdout) == []  # refused: never a job


def test_submit_refuses_when_submitit_would_write_another_script(slurm_cluster, cli, tmp_path):
    """The render == submit check runs before sbatch: a script that would differ is never submitted."""
    spec = write_spec(tmp_path, "mismatch", ["python", RECORD])
    before = slurm_cluster.run("squeue", "-h", "-o", "%i").stdout
    proc = cli("submit", str(spec), "--target", "slurm", env={"SUBMITIT_PREEMPT_SIGNAL": "USR1"}, timeout=120)
    assert proc.returncode == 3 and "nothing was submitted" in proc.stderr
    assert "-#SBATCH --signal=USR2@15" in proc.stderr and "+#SBATCH --signal=USR1@15" in proc.stderr
    assert not list((tmp_path / "slurm").glob("*/*_submission.sh"))
    assert slurm_cluster.run("squeue", "-h", "-o", "%i").stdout == before


def test_cancel_one_array_element(slurm_cluster, cli, tmp_path, ddpjob_home):
    """``ddpjob cancel ID --task 1`` (scancel ID_1) stops one run; the others go on until cancelled."""
    spec = write_spec(tmp_path, "cancel-one", ["python", RECORD, "--sleep", "300", "{i}"], nodes=1, sweep={"i": [0, 1]})
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"RUNNING"}, timeout=120)
    deadline = time.monotonic() + 120
    while {t["state"] for t in data["status"]["tasks"]} != {"RUNNING"}:
        assert time.monotonic() < deadline, data["status"]
        time.sleep(1)
        data = status(cli, job_id)
    one = cli("cancel", job_id, "--task", "1", timeout=120)
    assert one.returncode == 0 and "task 1 cancelled" in one.stdout, one.stderr
    tasks = status(cli, job_id)["status"]["tasks"]
    assert [t["state"] for t in tasks] == ["RUNNING", "CANCELLED"]
    assert cli("cancel", job_id, timeout=120).returncode == 0
    data = wait_for(cli, job_id, {"CANCELLED"}, timeout=60)
    assert [t["state"] for t in data["status"]["tasks"]] == ["CANCELLED", "CANCELLED"]
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel")


@pytest.mark.parametrize("how", ["usr2", "scontrol-requeue"])
def test_preempted_job_requeues_and_resumes(slurm_cluster, cli, tmp_path, how):
    """Interrupted mid-training, the job is requeued and the trainer resumes from its checkpoint, ending
    at the same step count as an uninterrupted run (steps * world size * batch covers the data once).

    usr2: what Slurm sends before a preemption or the time limit; submitit's checkpoint() path
    requeues. scontrol-requeue: an external requeue (SIGTERM, then SIGKILL after KillWait)."""
    steps = 20
    command = ["python", "-m", "launcher.train", "--dataset", "linreg", "--model", "linear", "--train-size",
               str(steps * 2 * 8), "--eval-size", "64", "--batch-size", "8", "--epochs", "1", "--lr", "0.01",
               "--checkpoint-every", "4", "--log-every", "1", "--step-delay", "0.4"]
    spec = write_spec(tmp_path, "requeue", command)
    job_id = submit(cli, str(spec))
    data = wait_for(cli, job_id, {"RUNNING"}, timeout=120)
    handle = data["handle"]
    metrics = Path(handle["job_dir"]) / "output" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and '"step": 6' in metrics.read_text()):
        assert time.monotonic() < deadline, "training never reached step 6"
        time.sleep(0.5)
    if how == "usr2":
        subprocess.run(["scancel", "--signal=USR2", handle["slurm_job_id"]], check=True, timeout=30)
    else:
        subprocess.run(["scontrol", "requeue", handle["slurm_job_id"]], check=True, timeout=30)
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    assert data["status"]["state"] == "SUCCEEDED", data["status"]
    events = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    preempted = [e for e in events if e.get("event") == "preempted"]
    resumed = [e for e in events if e.get("event") == "resume"]
    assert resumed and resumed[0]["step"] >= 4  # not from scratch: at least the first periodic checkpoint
    if how == "usr2":  # the trainer got the signal and checkpointed exactly where it stopped
        assert preempted and resumed[0]["step"] == preempted[0]["step"] > 0
    summary = json.loads((Path(handle["job_dir"]) / "output" / "summary.json").read_text())
    assert summary["steps"] == steps and not summary["preempted"]
    nodes = data["status"]["tasks"][0]["nodes"]
    assert all(n["restart"] >= 1 for n in nodes)


def _wait_until_cluster_is_quiet(cluster: Any, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = cluster.run("squeue", "-h", "-o", "%i %T", check=False).stdout.strip()
        nodes = cluster.run("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.split()
        if not jobs and nodes and all(n == "idle" for n in nodes):
            return
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_controller_down_is_exit_3_quickly_and_list_says_stale(slurm_cluster, cli, tmp_path, ddpjob_home):
    """With slurmctld stopped, status answers exit 3 'Slurm controller unreachable' within 15 s (its
    own 10 s limit on the controller; a status still running at 15 s is killed and fails the test;
    it used to print a stale RUNNING with exit 0), and list marks the last known state stale."""
    import signal as _signal

    spec = write_spec(tmp_path, "sleepy", ["python", "-c", "import time; time.sleep(300)"])
    job_id = submit(cli, str(spec))
    wait_for(cli, job_id, {"RUNNING"}, timeout=120)
    pidfile = slurm_cluster.root / "run" / "slurmctld.pid"
    pid = int(pidfile.read_text().strip())
    os.kill(pid, _signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    try:
        proc = cli("status", job_id, timeout=15)
        assert proc.returncode == 3 and "Slurm controller unreachable" in proc.stderr, proc.stdout + proc.stderr
        listing = cli("list", timeout=60)
        assert listing.returncode == 0 and "stale" in listing.stdout and "RUNNING" in listing.stdout, listing.stdout
    finally:
        slurm_cluster.script("up")
        assert cli("cancel", job_id, timeout=120).returncode == 0
    wait_for_no_job_processes(ddpjob_home, "ddpjob cancel, the controller back")


def test_a_slurm_job_notifies_once_when_it_ends(slurm_cluster, cli, tmp_path, ddpjob_home):
    """The watcher on the submitting machine asks Slurm until the job has ended (issue 25 item 7)."""
    from tests.foundation.test_found_notify import Hook, check_sent_once, notify_args

    hook = Hook()
    try:
        args, notes = notify_args(tmp_path, hook)
        job_id = submit(cli, str(write_spec(tmp_path, "notify", ["python", "-c", "print('done')"])), *args)
        check_sent_once(cli, job_id, hook, notes, "SUCCEEDED", ddpjob_home)
    finally:
        hook.server.shutdown()


def test_a_pending_job_shows_its_reason_and_place_in_the_queue(slurm_cluster, cli, tmp_path):
    """What a terminal shows while a job waits (issue 25 item 1): Slurm's reason and its place among
    the pending jobs; once it runs, the node files say how far it has come."""
    from launcher.service.jobs import Jobs
    from launcher.service.stages import live_line

    later = write_spec(tmp_path, "later", ["python", "-c", "print(1)"], slurm={"sbatch": {"begin": "now+1hour"}})
    first, second = submit(cli, str(later)), submit(cli, str(later))
    try:
        line = ""
        for _ in range(50):
            line = live_line(Jobs(), second)[1]
            if "BeginTime" in line:
                break
            time.sleep(0.2)
        assert line.startswith("PENDING: pending: BeginTime (") and "2 of 2 pending job(s)" in line, line
        assert "1 of 2 pending job(s)" in live_line(Jobs(), first)[1]
    finally:
        for job_id in (first, second):
            cli("cancel", job_id, timeout=60)


def test_defaults_from_a_user_config_reach_the_slurm_job(slurm_cluster, cli, tmp_path):
    """The user config's target and Slurm settings fill what the spec leaves out, in the job Slurm
    runs (issue 25 item 6)."""
    spec = write_spec(tmp_path, "cfg", ["python", "-c", "import os; print('from-user', os.environ['FROM_USER'])"])
    (tmp_path / "user.yaml").write_text("target: slurm\nslurm: {sbatch: {comment: from-user-config}}\n"
                                        "env: {FROM_USER: yes-u}\n")
    proc = cli("submit", str(spec), "-q", env={"DDPJOB_CONFIG": str(tmp_path / "user.yaml")}, timeout=180)
    assert proc.returncode == 0, proc.stderr  # no --target: the user config's
    job_id = proc.stdout.strip()
    data = wait_for(cli, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=150)
    assert data["state"] == "SUCCEEDED" and data["target"] == "slurm", data
    script = Path(data["handle"]["submission_file"]).read_text()  # what sbatch ran
    assert "#SBATCH --comment=from-user-config" in script, script
    assert "from-user yes-u" in cli("logs", job_id).stdout
