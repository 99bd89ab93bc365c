"""The three runners inside jobs share one core and import nothing client-side (issue 46 item 2).

Each runner runs here in a process of its own whose client-side modules are unimportable (a
``sys.meta_path`` finder refuses them, as a node without them would): the local node wrapper runs a tiny
node with its stall watch on, the Slurm node runner is unpickled and runs a one-node run (torchrun is
``true``), and the pod runner is started as a pod starts it, from its bundle, with no module of ddpjob
importable at all. The last test shows the finder is not blind."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from launcher.targets.k8s.objects import runner
from launcher.targets.local.job import node as local_node
from launcher.targets.slurm.job.nodeplan import SlurmCommon, SlurmElement

ROOT = Path(__file__).resolve().parents[2]
TRUE = "/bin/true"

# What only the client holds: the service and the command line, the spec (pydantic), the target interface,
# each target's planning and scheduler modules, and the third-party clients.
CLIENT = ("launcher.service", "launcher.cli", "launcher.spec", "launcher.api", "launcher.ui", "launcher.doctor",
          "launcher.targets.base", "launcher.targets.chosen", "launcher.targets.lookup", "launcher.targets.jobstatus",
          "launcher.targets.k8s.objects", "launcher.targets.k8s.validation", "launcher.targets.k8s.cluster",
          "kubernetes", "submitit", "pydantic", "click", "yaml", "starlette", "uvicorn")
TARGET_CLIENT = ("payload", "target", "status", "options", "submit", "query", "container", "bundles", "network",
                 "ports", "portmove", "watch", "check")


def refusing(blocked: tuple[str, ...], leaves: tuple[str, ...] = TARGET_CLIENT) -> str:
    """Python source that makes ``blocked`` (and the targets' client modules ``leaves``) unimportable."""
    return textwrap.dedent(f"""
        import sys

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                parts = name.split(".")
                if any(name == b or name.startswith(b + ".") for b in {blocked!r}) or (
                        len(parts) == 4 and parts[:2] == ["launcher", "targets"] and parts[3] in {leaves!r}):
                    raise ImportError("client-side module imported in a job: " + name)
                return None

        sys.meta_path.insert(0, Refuse())
        """)


def run_refused(code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
                blocked: tuple[str, ...] = CLIENT, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", refusing(blocked) + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60, cwd=cwd or ROOT,
                          env={**os.environ, **(env or {})}, check=False)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_local_node_wrapper_runs_a_watched_node_without_the_client(tmp_path):
    """As the supervisor starts it (``python -I -S`` by path), with its watch: the first node's watch.json."""
    exit_file = tmp_path / "node-0.exit.json"
    argv = [TRUE, "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    code = f"""
        import runpy
        sys.argv = [{local_node.__file__!r}, {str(exit_file)!r}, "--", *{argv!r}]
        try:
            runpy.run_path({local_node.__file__!r}, run_name="__main__")
        finally:
            import json
            print(json.dumps(sorted(m for m in sys.modules if m.startswith("launcher"))))
        """
    done = run_refused(code, flags=("-I", "-S"), cwd=tmp_path,
                       env={"DDPJOB_WATCH": "node=0 nodes=1 timeout=300 action=report"})
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(exit_file.read_text())
    assert record["exit_code"] == 0 and record["signal"] is None
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "launcher.targets.shared.jobcore" in loaded and "launcher.targets.shared.heartbeat" in loaded
    assert "no stall watch" not in done.stderr


def test_the_slurm_node_runner_is_unpickled_and_runs_without_the_client(tmp_path):
    """As submitit runs it: unpickled in the job (its plain data from ``job/nodeplan.py``), then a one-node run."""
    common = SlurmCommon(job_id="j", job_dir=str(tmp_path / "job"), nodes=1, procs_per_node=1, python=TRUE,
                         submit_python=sys.executable, workdir=str(tmp_path), max_restarts=0,
                         master_port=free_port(), requeue=False, signal_delay_s=90, max_timeouts=0, env={})
    from launcher.targets.slurm.job.node import NodeRunner

    pickled = tmp_path / "runner.pkl"
    pickled.write_bytes(pickle.dumps(NodeRunner(common, SlurmElement(0, {}, str(tmp_path / "out"), {}, ["x.py"]))))
    code = f"""
        import json, pickle
        with open({str(pickled)!r}, "rb") as f:
            runner = pickle.load(f)
        print(json.dumps(runner()))
        """
    done = run_refused(code, env={"SLURM_NODEID": "0", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"node": 0, "host": socket.gethostname(), "exit_code": 0}
    record = json.loads((tmp_path / "job" / "task-0" / "node-0.json").read_text())
    assert record["state"] == "exited" and record["exit_code"] == 0


def test_the_pod_runner_runs_from_its_bundle_with_no_ddpjob_at_all(tmp_path):
    """As a pod starts it (``python3 -c BOOT torchrun ...``), every module of ddpjob unimportable: the
    bundle carries the runner core with the shared modules."""
    env = {runner.BUNDLE_ENV: runner.bundle(), "PET_NODE_RANK": "0", "PET_NNODES": "1",
           "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()), "DDPJOB_WATCH_PORT": str(free_port()),
           "DDPJOB_STALL_TIMEOUT_S": "300", "DDPJOB_STALL_ACTION": "report", "DDPJOB_SAMPLE_STACKS": "0"}
    code = f"sys.argv = ['-c', {TRUE!r}]\n" + runner.BOOT
    done = run_refused(code, env=env, cwd=tmp_path, blocked=(*CLIENT, "launcher"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_the_pod_runner_imports_in_the_package_without_the_client():
    done = run_refused("import launcher.targets.k8s.job.podrun, launcher.targets.k8s.job.podstacks\n"
                       "import launcher.targets.slurm.job.node, launcher.targets.shared.jobcore\n")
    assert done.returncode == 0, done.stderr


def test_the_refusal_is_not_blind(tmp_path):
    """A runner that imports a client module, at its top or at run time, fails here."""
    for line in ("import launcher.targets.slurm.payload", "from launcher.targets.k8s import options",
                 "import launcher.spec.model", "import submitit"):
        done = run_refused(line)
        assert done.returncode != 0 and "client-side module imported in a job" in done.stderr, line
    done = run_refused("import launcher.targets.shared.heartbeat, launcher.targets.slurm.job.nodeplan")
    assert done.returncode == 0, done.stderr
