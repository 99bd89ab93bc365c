"""The project's own Slurm cluster (slurm/cluster.sh) is real: two nodes with distinct hostnames,
accounting that can be switched off and on, concurrent jobs, idempotent ``up``, ``status``/``env``,
and ``down`` that keeps state (``--purge`` deletes it)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from testkit import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.real]
SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "cluster.sh"


def _node_states(cluster: Any) -> dict[str, str]:
    out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _sacct_state(cluster: Any, job: str) -> str:
    return cluster.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State", check=False).stdout.strip()


def _running_pids(status_stdout: str) -> list[str]:
    return sorted(line for line in status_stdout.splitlines() if "running (pid" in line)


def test_two_idle_nodes_with_distinct_hostnames(slurm_cluster):
    # Idle once any job of an earlier test has left (nothing else should hold the nodes for long).
    states = wait_for(lambda: (s := _node_states(slurm_cluster)) == {"n1": "idle", "n2": "idle", "n3": "idle"} and s,
                      "n1, n2 and n3 idle", timeout=60)
    assert states == {"n1": "idle", "n2": "idle", "n3": "idle"}
    hosts = slurm_cluster.run("srun", "-N2", "-n2", "-t", "1", "/bin/hostname").stdout.split()
    assert sorted(hosts) == ["n1", "n2"]
    # The names resolve (the node runner resolves the first node's name to the rendezvous address):
    # apart, on the nodes themselves (each sees its own /etc/hosts) to their bridge addresses;
    # together, on this machine, to the loopback addresses.
    if slurm_cluster.addresses:
        out = slurm_cluster.run("srun", "-N2", "-n2", "-t", "1", "getent", "hosts", "n1", "n2", "n3").stdout.split()
        pairs = {(out[i + 1], out[i]) for i in range(0, len(out), 2)}
        assert pairs == {(n, a) for n, a in slurm_cluster.addresses.items()}, out
        assert all(not a.startswith("127.") for a in slurm_cluster.addresses.values())
    else:
        for name, addr in (("n1", "127.0.77.1"), ("n2", "127.0.77.2"), ("n3", "127.0.77.3")):
            assert subprocess.run(["getent", "hosts", name], check=False, capture_output=True, text=True).stdout.split()[0] == addr


def test_accounting_records_a_finished_job(slurm_cluster):
    assert slurm_cluster.accounting
    job = slurm_cluster.run("sbatch", "--parsable", "-N1", "--output=/dev/null", "--wrap", "/bin/true").stdout.strip()
    assert wait_for(lambda: _sacct_state(slurm_cluster, job) == "COMPLETED", f"sacct to show job {job} COMPLETED",
                    timeout=60)


def test_two_jobs_run_at_once_on_the_same_nodes(slurm_cluster):
    """Each node advertises 8 CPUs: two 2-node jobs (2 CPUs per task) share n1 and n2."""
    jobs = [slurm_cluster.run("sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-c2", "-t", "2",
                              "--output=/dev/null", "--wrap", "srun /bin/sleep 60").stdout.strip() for _ in range(2)]
    try:
        def both_running():
            out = slurm_cluster.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T %N").stdout
            rows = [line.split() for line in out.splitlines()]
            return len(rows) == 2 and all(r[1] == "RUNNING" and r[2] == "n[1-2]" for r in rows) and rows
        assert wait_for(both_running, "both jobs RUNNING on n[1-2]", timeout=60)
    finally:
        slurm_cluster.run("scancel", *jobs, check=False)
    wait_for(lambda: not slurm_cluster.run("squeue", "-h", "-j", ",".join(jobs), check=False).stdout.strip(),
             "the cancelled jobs to leave the nodes", timeout=60)


def test_up_is_idempotent_and_status_reports(slurm_cluster):
    before = slurm_cluster.script("status")
    again = slurm_cluster.script("up", timeout=120)
    after = slurm_cluster.script("status")
    assert len(_running_pids(after.stdout)) == 7
    assert _running_pids(before.stdout) == _running_pids(after.stdout)  # nothing was restarted
    assert "accounting: on" in after.stdout and "cluster: up" in after.stdout
    assert "up: nodes n1 n2 n3, accounting on" in again.stderr


def test_env_prints_what_a_client_exports(slurm_cluster):
    proc = slurm_cluster.script("env")
    assert proc.stdout.startswith("export SLURM_CONF=")
    assert slurm_cluster.client_env() == slurm_cluster.env
    conf = Path(slurm_cluster.env["SLURM_CONF"])
    assert conf.is_file() and conf.parent.parent == slurm_cluster.root
    # A shell that evals it reaches this cluster.
    sh = subprocess.run(check=False, args=["bash", "-c", f'eval "$(bash {SCRIPT} env)" && scontrol ping'],
                        env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"},
                        capture_output=True, text=True, timeout=60)
    assert sh.returncode == 0 and "is UP" in sh.stdout, sh.stdout + sh.stderr


def test_bad_usage_is_refused():
    """Usage errors exit 2 before touching anything (no cluster needed)."""
    for args in (["up", "--bogus"], ["down", "--bogus"], ["status", "-x"], ["frobnicate"], []):
        proc = subprocess.run(["bash", str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 2, (args, proc.stderr)
        if args[:2] == ["up", "--bogus"]:
            assert "unknown option --bogus" in proc.stderr


def test_accounting_can_be_switched_off_and_on(slurm_cluster):
    """``up --no-accounting`` restarts slurmctld without accounting storage; ``up`` switches back.
    A job running across both switches survives them."""
    # Long enough to outlast both switches on a loaded machine (30 s did not, once); cancelled at the end.
    long_job = slurm_cluster.run("sbatch", "--parsable", "-N2", "-t", "4", "--output=/dev/null",
                                 "--wrap", "srun /bin/sleep 200").stdout.strip()
    wait_for(lambda: slurm_cluster.run("squeue", "-h", "-j", long_job, "-o", "%T").stdout.strip() == "RUNNING",
             "the long job to run", timeout=60)
    try:
        slurm_cluster.set_accounting(False)
        assert "accounting: off" in slurm_cluster.script("status").stdout
        off = slurm_cluster.run("sacct", "-j", long_job, check=False)
        assert off.returncode != 0 and "disabled" in (off.stdout + off.stderr)
        hosts = slurm_cluster.run("srun", "-N2", "-n2", "-t", "1", "/bin/hostname").stdout.split()
        assert sorted(hosts) == ["n1", "n2"]
        assert slurm_cluster.run("squeue", "-h", "-j", long_job, "-o", "%T").stdout.strip() == "RUNNING"
    finally:
        slurm_cluster.set_accounting(True)
    assert "accounting: on" in slurm_cluster.script("status").stdout
    job = slurm_cluster.run("sbatch", "--parsable", "-N1", "--output=/dev/null", "--wrap", "/bin/true").stdout.strip()
    assert wait_for(lambda: _sacct_state(slurm_cluster, job) == "COMPLETED", f"sacct to show job {job} COMPLETED",
                    timeout=60)
    assert slurm_cluster.run("squeue", "-h", "-j", long_job, "-o", "%T", check=False).stdout.strip() == "RUNNING"
    slurm_cluster.run("scancel", long_job, check=False)


def test_no_accounting_fixture(slurm_no_accounting):
    assert not slurm_no_accounting.accounting
    assert "accounting: off" in slurm_no_accounting.script("status").stdout
    assert sorted(slurm_no_accounting.run("srun", "-N2", "-n2", "-t", "1", "/bin/hostname").stdout.split()) == ["n1", "n2"]


def test_a_root_that_munge_cannot_reach_is_refused_clearly(slurm_cluster, tmp_path):
    """pytest's tmp_path sits in a 0700 directory: munged (user munge) could not use it."""
    root = tmp_path / "unreachable"
    proc = slurm_cluster.script("up", env={"DDPJOB_SLURM_ROOT": str(root), "SLURM_TEST_PORT": "19917"},
                                check=False, timeout=120)
    assert proc.returncode == 1 and "user munge cannot reach" in proc.stderr, proc.stderr
    assert f"({root})" not in Path("/etc/hosts").read_text()


def test_a_second_cluster_down_keeps_state_and_purge_deletes_it(slurm_cluster):
    """A second, throwaway cluster (own root and ports) beside the session's: a fresh ``up``,
    ``down`` keeps job ids going, ``down --purge`` deletes everything and its /etc/hosts block only."""
    parent = Path(tempfile.mkdtemp(prefix="ddpjob-slurm-second-", dir="/tmp"))
    parent.chmod(0o755)  # munged and mariadbd (users munge, mysql) must reach the root
    root = parent / "root"
    env = {"DDPJOB_SLURM_ROOT": str(root), "SLURM_TEST_PORT": os.environ.get("DDPJOB_SLURM_TEST_PORT2", "19817")}
    second = type(slurm_cluster)(root=root, env=slurm_cluster.client_env(env))
    try:
        slurm_cluster.script("up", env=env, timeout=300)
        assert "cluster: up" in slurm_cluster.script("status", env=env).stdout
        first = second.run("sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "/bin/true").stdout.strip()
        assert f"# BEGIN ddpjob-slurm ({root})" in Path("/etc/hosts").read_text()
        slurm_cluster.script("down", env=env, timeout=120)
        assert slurm_cluster.script("status", env=env, check=False).returncode == 3
        assert f"({root})" not in Path("/etc/hosts").read_text()
        assert (root / "state").is_dir()
        slurm_cluster.script("up", env=env, timeout=300)
        later = second.run("sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "/bin/true").stdout.strip()
        assert int(later) > int(first)  # state kept: job ids keep increasing (sacct history stays consistent)
    finally:
        slurm_cluster.script("down", "--purge", env=env, timeout=120, check=False)
    assert not root.exists()
    parent.rmdir()
    assert f"({root})" not in Path("/etc/hosts").read_text()
    # The session's cluster was not touched.
    assert "cluster: up" in slurm_cluster.script("status").stdout
    assert sorted(slurm_cluster.run("srun", "-N2", "-n2", "-t", "1", "/bin/hostname").stdout.split()) == ["n1", "n2"]


def test_up_repairs_a_database_user_with_another_password(slurm_cluster):
    """A database whose slurm user has another password (left by another run) used to leave
    slurmdbd unable to log in while up reported 'accounting on'. up sets the password back and
    reports accounting on only once sacct answers."""
    import signal

    sock = slurm_cluster.root / "db" / "run" / "mysqld.sock"
    subprocess.run(["mariadb", f"--socket={sock}", "-u", "root", "-e",
                    "ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'another'; "
                    "ALTER USER 'slurm'@'localhost' IDENTIFIED BY 'another'; FLUSH PRIVILEGES;"],
                   check=True, capture_output=True, timeout=60)
    pidfile = slurm_cluster.root / "run" / "slurmdbd.pid"
    pid = int(pidfile.read_text().strip())
    os.kill(pid, signal.SIGTERM)  # it must log in again, as after a restart of the machine
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), "slurmdbd to stop", timeout=60)
    up = slurm_cluster.script("up")
    assert "accounting on" in up.stderr, up.stderr
    assert slurm_cluster.run("sacct", "-n", "-X", "-S", "now-1hours", "-o", "JobID").returncode == 0
