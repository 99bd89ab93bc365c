"""Helpers for tests in any directory: reference material reached through DDPJOB_SHARED, the
cleanup of processes a test leaves behind, the test tiers and the Ctrl-C a test needs. Import by
name (``from testkit import needs_crd``)."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the checkout: where `ddpjob` runs unless told
# What the tests keep between runs (hypothesis's folder, compiled code, the verdicts of reference
# checkers): a folder of this user outside the checkout (tests/conftest.py makes it).
TESTS_HOME = Path(tempfile.gettempdir()) / f"ddpjob-tests-{os.getuid()}"

# Reference material outside the repository (the upstream PyTorchJob CRD, ...) reaches the tests
# only through DDPJOB_SHARED (.ci/run sets it when ../shared exists). Tests that need it skip with a
# reason without it, so a fresh clone passes; the product itself never looks there.
SHARED = Path(os.environ["DDPJOB_SHARED"]) if os.environ.get("DDPJOB_SHARED") else None
_CRD = SHARED / "reference" / "kubeflow" / "kubeflow.org_pytorchjobs.yaml" if SHARED else None
if os.environ.get("DDPJOB_PYTORCHJOB_CRD") is None and _CRD is not None and _CRD.exists():
    os.environ["DDPJOB_PYTORCHJOB_CRD"] = str(_CRD)
PYTORCHJOB_CRD = os.environ.get("DDPJOB_PYTORCHJOB_CRD")

# Under CI (CI=true) nothing skips: a missing CRD there is a broken setup, so those tests fail.
needs_crd = pytest.mark.skipif(
    not (PYTORCHJOB_CRD and Path(PYTORCHJOB_CRD).exists()) and os.environ.get("CI", "").lower() != "true",
    reason="needs the upstream PyTorchJob CRD: set DDPJOB_SHARED=<the shared/ folder> or DDPJOB_PYTORCHJOB_CRD=<file> "
    "(kubeflow.org_pytorchjobs.yaml of training-operator v1.9.x: see k8s/README.md for where to get it)",
)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc; zombies left out), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def stop_leftovers(home: Path) -> tuple[list[int], list[int]]:
    """Stop the job processes (those with a DDPJOB_JOB_ID) started under registry ``home``.
    Returns (the pids found, those that survived)."""
    from launcher.targets.shared import procs

    left = job_pids(home)
    return left, procs.terminate([(p, procs.start_time(p)) for p in left], grace=2.0) if left else []


def job_pids(home: Path) -> list[int]:
    """The job processes (supervisors, agents, workers, pods) started under registry ``home``."""
    from launcher.targets.shared import procs

    return [p for p in procs.marked_pids("DDPJOB_HOME", str(home)) if _runs_a_job(p)]


def wait_for_no_job_processes(home: Path, after: str, timeout: float = 30) -> None:
    """Every process of the jobs under ``home`` ends within ``timeout`` s of ``after`` (a cancel:
    schedulers stop a job's processes after they answer, so a test waits rather than looks once)."""
    wait_for(lambda: not job_pids(home), f"the job's processes to end after {after}", timeout=timeout)


def _runs_a_job(pid: int) -> bool:
    """A job's process (supervisor, agent, worker, pod) carries its id; Slurm's daemons do not."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(v.startswith(b"DDPJOB_JOB_ID=") for v in f.read().split(b"\0"))
    except OSError:
        return False


# Tests in tiers (docs/developing.md, "Tests"): ``pytest -m "not real"`` is the pure tier, which starts no torchrun,
# podman, Slurm or API server and runs in under a minute; ``real`` marks the rest. A test that uses one
# of these fixtures (directly or through another fixture) starts such a thing, so tests/conftest.py
# marks it real wherever it lives; tests/foundation/test_found_tiers.py keeps this list true.
REAL_FIXTURES = {
    "slurm_cluster": "the private Slurm cluster (tests/slurm/conftest.py)",
    "k8s_api": "the loopback Kubernetes API server over HTTP (tests/k8s/conftest.py)",
    "engine_image": "podman and the training image (tests/container/conftest.py)",
    "run_torchrun": "a real torchrun (tests/train/conftest.py)",
    "registry": "a real image registry on 127.0.0.1 (tests/imagebuild/conftest.py)",
    "registry_with_login": "a real image registry that requires a login (tests/imagebuild/conftest.py)",
    "registry_tls": "a real image registry over HTTPS, its certificate trusted by podman (tests/imagebuild/conftest.py)",
    "base_image": "podman and its small base image (tests/imagebuild/conftest.py)",
    "train_image": "podman and the training image, with Python and pip (tests/imagebuild/conftest.py)",
    "dashboard": "the ddpjob ui server (tests/ui/conftest.py)",
    "browser": "a headless chromium (tests/ui/conftest.py)",
}
REAL_MARKERS = ("slurm",)  # a module marked slurm needs the cluster: real too


def sigint_default() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT: the default disposition in the child.

    A process started with SIGINT ignored (``nohup``, a background job of a non-interactive shell,
    some CI runners) passes that on to its children, and a Python started so installs no
    KeyboardInterrupt handler at all: the test's Ctrl-C would be lost. Tests set what they need."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """Within the block, SIGINT in this process raises KeyboardInterrupt (Python's own handler),
    whatever pytest was started with; the disposition it had is restored after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


T = TypeVar("T")

# Job programs several tests run: each rank marks its start and sleeps; rank 1 fails after a second.
SLEEPER = '''
import os, time
open(os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "started-%s" % os.environ["RANK"]), "w").close()
print("sleeping", os.environ["RANK"], flush=True)
time.sleep(600)
'''
FAILER = '''
import os, time
print("hello from rank", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1":
    time.sleep(1)
    raise SystemExit("boom: rank 1 could not open its shard")
time.sleep(600)
'''


def wait_for(check: Callable[[], T], what: str, timeout: float = 120, poll: float = 0.2) -> T:
    """``check()``'s first true value; fails the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")


def run_in_pty(argv: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
               answers: tuple[tuple[str, str], ...] = (), timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` with stdin, stdout and stderr on a new pseudo-terminal (what a user at a terminal
    sees): each ``(prompt, reply)`` of ``answers`` in turn, once ``prompt`` is in the output, types
    ``reply``; a reply of ``"\\x03"`` is Ctrl-C, which the terminal turns into SIGINT for the program
    (the terminal is its controlling terminal, as in a shell). Returns (exit code, everything written,
    with the terminal's \\r\\n as \\n)."""
    import pty
    import select
    import subprocess

    def own_terminal() -> None:
        import fcntl
        import termios

        sigint_default()
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # fd 0 is the terminal's other end by now

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                            preexec_fn=own_terminal)  # noqa: PLW1509 - no threads here
    os.close(slave)
    out = b""
    looked_from = 0
    pending = list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child's side is closed, it has exited
                    break
                if not chunk:
                    break
                out += chunk
            if pending and pending[0][0].encode() in out[looked_from:]:
                os.write(master, pending.pop(0)[1].encode())
                looked_from = len(out)  # the next prompt is looked for in what comes after
            if not ready and proc.poll() is not None:
                break
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            out += f"\n[run_in_pty: still running after {timeout:g} s: killed]".encode()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return proc.wait(), out.decode(errors="replace").replace("\r\n", "\n")


def marked_sweep(cli: Callable[..., object], tmp_path: Path, name: str, stage: str) -> tuple[Path, str]:
    """Submit a 2-run sweep (``python stage.py {i}``, i in 0, 1) of the script ``stage``, which reads
    the folder of marker files from $MARKS; returns that folder (``tmp_path/marks``) and the job's id."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "stage.py").write_text(stage)
    (tmp_path / "job.yaml").write_text(
        f"name: {name}\ncommand: [python, stage.py, '{{i}}']\nsweep: {{i: [0, 1]}}\nenv: {{MARKS: '{marks}'}}\n")
    proc = cli("submit", "-q", "job.yaml", cwd=tmp_path, check=True)
    return marks, proc.stdout.strip()  # type: ignore[attr-defined]


# The command line, as the `cli` fixture of tests/conftest.py runs it (here: one module name from
# any test directory; each directory's own conftest.py is also imported as ``conftest``).
def ddpjob(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
           timeout: float = 300, check: bool = False, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``ddpjob`` command line in a subprocess (what users run); ``input``: what it reads
    from its standard input (a pipe), else it has this process's."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"ddpjob {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def parsed(path: Path) -> ast.Module:
    """The module at ``path`` parsed, once per test process for every test that reads the code of
    launcher/ (five files of tests walk the whole package: ~1-2 s a parse of it). A file changed since
    (by its size or time) is parsed again. The tree is shared: read it, never change it."""
    st = path.stat()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


def walked(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``parsed(path)`` in ``ast.walk``'s order, kept as ``parsed`` keeps the tree: a walk
    of the whole package costs about as much as its parse, and several checks walk it."""
    st = path.stat()
    return _walked(str(path), st.st_mtime_ns, st.st_size)


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(), path)


@functools.cache
def _walked(path: str, mtime_ns: int, size: int) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_parsed(path, mtime_ns, size)))


@functools.cache
def start_up_modules() -> frozenset[str]:
    """The modules a fresh Python has loaded once it has imported the command line (``import
    launcher.cli.main``, what ``ddpjob`` does before it parses its arguments): one process for all the
    tests of what start-up loads (heavy libraries, plotting, the service layer), each asking its own."""
    code = "import json, sys, launcher.cli.main; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return frozenset(json.loads(out))


def ddpjob_in_process(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                      timeout: float = 300, check: bool = False,
                      input: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``ddpjob`` like ``ddpjob()`` does, but in this process: ``launcher.cli.main.main`` (what the
    entry point runs once it has set up the process) with ``sys.argv``, the environment (``env`` over
    this one), the folder and standard streams of its own (standard input holds ``input``), as
    click's ``CliRunner`` isolates them. An exception that would end the process does the same here:
    Python's traceback on stderr and exit 1. What ``main`` sets for the whole process (the umask,
    SIGINT ignored once it is done, ``--debug``) is put back afterwards. ``timeout`` is not enforced in-process (a pure test runs no job)."""
    import signal
    import traceback

    import click.formatting
    from click.testing import CliRunner

    from launcher.cli.main import main
    from launcher.cli.support import DEBUG

    saved = (os.umask(0o077), signal.getsignal(signal.SIGINT), sys.argv, os.getcwd(), DEBUG["on"])
    os.umask(saved[0])
    code: int = 0
    with CliRunner().isolation(input=input, env=env) as (out, err, _):
        sys.argv = ["ddpjob", *args]
        DEBUG["on"] = bool(os.environ.get("DDPJOB_DEBUG"))  # read at start-up in a process of its own
        # --help as wide as in a process whose output is a pipe: $COLUMNS or 80, less click's margin
        # (the runner fixes 80; it puts its own value back afterwards).
        click.formatting.FORCED_WIDTH = max(min(int(os.environ.get("COLUMNS") or 80), 80) - 2, 50)
        try:
            os.chdir(cwd or ROOT)
            main()
        except SystemExit as e:
            if isinstance(e.code, int) or e.code is None:
                code = e.code or 0
            else:  # as the interpreter does with sys.exit("message")
                print(e.code, file=sys.stderr)
                code = 1
        except Exception:  # what would end the process: its traceback, exit 1
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            DEBUG["on"] = saved[4]
            os.chdir(saved[3])
            sys.argv = saved[2]
            signal.signal(signal.SIGINT, saved[1])
            os.umask(saved[0])
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode(errors="backslashreplace")
    proc = subprocess.CompletedProcess(["ddpjob", *args], code, stdout, stderr)
    if check and code != 0:
        raise AssertionError(f"ddpjob {' '.join(args)} exited {code}\n{stdout}\n{stderr}")
    return proc
