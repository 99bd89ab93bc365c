"""One node of a local job: ``python -I -S .../launcher/targets/local/job/node.py EXIT_FILE -- ARGV...``.

The supervisor starts each torchrun agent through this small wrapper, which runs the agent as its
child, passes on the signals that stop it, and writes how the agent ended to ``EXIT_FILE``
(``{"exit_code": 0, "signal": null, "ended": ...}``). The record is the job's truth when the
supervisor itself is gone (SIGKILL, the OOM killer): the agents and their workers run on, and
``status`` reads the records once they end. The file is allocated when the node starts and
overwritten in place at the end, so the record can be written even on a full disk.

It stands between the supervisor and torchrun on every start, so it starts in a third of the time
``python -m`` would take (tests/bench/cli_bench.py): run by path in isolated mode without ``site``
(``-I -S``: nothing of the user's or the environment's is imported), standard library only, the
agent spawned before anything else is imported, ``typing`` never imported.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing is never imported here (see above); mypy reads this block all the same
if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.targets.shared import heartbeat

RECORD_SIZE = 1024  # bytes allocated up front; a record is far smaller
WATCH_ENV = "DDPJOB_WATCH"  # the stall watch of the node (see _watch), read and removed before the agent starts


class LogStream:
    """``sys.stdout``/``sys.stderr`` of the node wrapper and of the supervisor: each write goes
    straight to the file descriptor, and one the disk refuses is dropped. Python flushes both
    streams at exit and exits with 120 when that fails: with a full disk under the log, a buffered
    line that could not be written turned a node that succeeded, or the supervisor, into exit 120.
    Nothing is ever left in a buffer here."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, text: str) -> int:
        try:
            os.write(self.fd, text.encode("utf-8", "replace"))
        except OSError:
            pass
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.fd


def package_root() -> str:
    """The folder that holds the ``launcher`` package (this file is launcher/targets/local/job/node.py)."""
    return os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))


def unbuffered_output() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` with ``LogStream``s (see there)."""
    sys.stdout, sys.stderr = LogStream(1), LogStream(2)


def command(python: str, exit_file: str, argv: list[str], cgroup: str | None = None) -> list[str]:
    """The command line that runs ``argv`` as one node, recording how it ends in ``exit_file``;
    with ``cgroup``, the node's processes run in that cgroup (launcher.targets.local.job.cgroups)."""
    where = ["--cgroup", cgroup] if cgroup else []
    return [python, "-I", "-S", os.path.abspath(__file__), exit_file, *where, "--", *argv]


class Proc:
    """A started node wrapper, with the few ``subprocess.Popen`` methods the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # never a signal to a reaped pid, which may have been reused
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(python: str, exit_file: str, argv: list[str], *, env: dict[str, str], cwd: str, log: str,
          cgroup: str | None = None) -> Proc:
    """Start ``argv`` as one node through this wrapper, in ``cwd``, its output appended to ``log``
    and nothing on its stdin; as ``subprocess.Popen`` would, without importing subprocess on the way
    to the first torchrun. Raises OSError when the wrapper cannot start (``cwd`` or ``log`` included)."""
    try:
        home = os.getcwd()
    except OSError:  # this process's own directory is gone
        home = "/"
    os.chdir(cwd)  # posix_spawn starts the child in this process's directory
    try:
        pid = os.posix_spawn(python, command(python, exit_file, argv, cgroup), env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ], setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    finally:
        os.chdir(home)
    return Proc(pid)


def wait_for_exit(pids: list[int], timeout: float) -> None:
    """Return when one of ``pids`` has ended, or after ``timeout`` seconds.

    With pidfds (Linux 5.3+) the supervisor wakes the moment a node ends, not at its next poll: a
    finished job is recorded at once, and nothing spins meanwhile. Elsewhere it polls every 50 ms.
    """
    import select

    fds: list[int] = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):  # no pidfd_open here, or a pid already reaped
        for fd in fds:
            os.close(fd)
        time.sleep(min(timeout, 0.05))
        return
    try:
        select.select(fds, [], [], timeout)
    finally:
        for fd in fds:
            os.close(fd)


def wait_for_all(procs: list[Proc], seconds: float) -> None:
    """Return when every one of ``procs`` has ended, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := [p.pid for p in procs if p.poll() is None]) and time.monotonic() < deadline:
        wait_for_exit(left, deadline - time.monotonic())


def write_record(path: str, record: dict[str, object], *, create: bool = False) -> None:
    """Write ``record`` padded to ``RECORD_SIZE`` bytes: created once, then overwritten in place."""
    import json

    data = json.dumps(record, sort_keys=True).encode().ljust(RECORD_SIZE)
    with open(path, "wb" if create else "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_record(path: str) -> dict[str, object] | None:
    """The record, or None when the node has not written one (not started, or still running)."""
    import json

    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8", "replace").strip() or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("exit_code") is not None else None


def run(exit_file: str, argv: list[str], cgroup: str | None = None) -> int:
    started = time.time()
    if cgroup:
        try:  # before the agent starts: it and everything it starts are inside, whatever session or environment
            with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            _say(f"[ddpjob] cannot enter the node's cgroup {cgroup}: {e}; cancel finds its processes by the job's marker")
    child: list[int] = []  # the agent's pid, once it runs
    pending: list[int] = []  # signals that came before it did

    def forward(signum: int, frame: object) -> None:
        if not child:
            pending.append(signum)
            return
        if child[0] > 0:  # never a signal to a reaped pid, which may have been reused
            try:
                os.kill(child[0], signum)  # torchrun stops its workers on SIGTERM
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)  # before the spawn: a stop request can never miss the agent
    watch = os.environ.pop(WATCH_ENV, "")  # the wrapper's, not the agent's
    try:
        # As subprocess would start it (the signals Python ignores back to their defaults; caught
        # ones are reset by exec), without importing subprocess.
        child.append(os.posix_spawnp(argv[0], argv, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)))
    except OSError as e:
        _say(f"[ddpjob] cannot start {argv[0]}: {e}")
        _record(exit_file, {"exit_code": 127, "signal": None, "ended": time.time(), "error": str(e)}, create=True)
        return 127
    for signum in pending:
        forward(signum, None)
    agent = child[0]
    created = _record(exit_file, {"exit_code": None, "started": started, "pid": agent}, create=True)
    stalled: list[str] = []
    watcher = _watch(watch, exit_file, argv, agent, stalled) if watch else None
    _, status = os.waitpid(agent, 0)
    child[0] = 0
    if watcher is not None:
        watcher.stop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # Nothing left to forward to. Ignored, not merely unforwarded: Python restores the default
        # action of the signals it handles as it exits, and the supervisor's SIGTERM to stop the
        # job's other nodes would then kill this wrapper (exit -15) after its agent failed on its own.
        signal.signal(sig, signal.SIG_IGN)
    code = os.waitstatus_to_exitcode(status)
    sig_name = signal.Signals(-code).name if code < 0 else None
    end: dict[str, object] = {"exit_code": code, "signal": sig_name, "ended": time.time(), "pid": agent}
    if stalled:
        end.update(stalled=stalled[0][:RECORD_SIZE // 2], exit_code=code or 1)
    _record(exit_file, end, create=not created)
    if stalled:
        return code if code > 0 else 1
    return 128 - code if code < 0 else code


def _watch(config: str, exit_file: str, argv: list[str], agent: int, stalled: list[str]) -> heartbeat.Watch | heartbeat.Beacon | None:
    """This node's side of the stall watch and its ranks' vitals (``DDPJOB_WATCH``, set by the plan):
    the first node runs the ``Watch``, the others a ``Beacon``, as Slurm's node runner does
    (``launcher.targets.shared.heartbeat``). Imported only now, the agent already started. With
    ``stall.action: fail`` a stall stops the agent (its stopped ranks killed first, as nothing else
    would end them) and the node ends failed with the reason in its exit record. A node in a container
    (``container=NAME``): ``agent`` is the engine's client, and the ranks are found under the
    container's own torchrun agent (``_in_container``)."""
    import functools
    import threading

    sys.path.insert(0, package_root())
    from launcher.targets.shared import jobcore, stacks, vitals

    try:
        c = dict(word.partition("=")[::2] for word in config.split())
        node, nodes, timeout = int(c["node"]), int(c["nodes"]), float(c["timeout"])
        addr, port = argv[argv.index("--master-addr") + 1], int(argv[argv.index("--master-port") + 1])
    except (ValueError, KeyError, IndexError) as e:
        _say(f"[ddpjob] no stall watch: {WATCH_ENV}={config!r} and the torchrun command do not say it ({e!r})")
        return None
    if c.get("container"):  # every wrapper runs on this machine, outside the containers (whose bridge
        addr = "127.0.0.1"  # network's addresses are theirs, not the wrappers')
    from launcher.targets.shared.runfolder import TaskFolder, log_of_exit_file

    task = TaskFolder(os.path.dirname(os.path.abspath(exit_file)))
    log = log_of_exit_file(exit_file)
    ranks_of = _in_container(argv[0], c["container"]) if c.get("container") else (lambda: agent)
    sampler = jobcore.sampler(node, ranks_of, log=log, steps_dir=os.environ.get(vitals.VITALS_DIR_ENV))

    def on_stall(message: str) -> None:
        stalled.append(message)
        _say(f"[ddpjob] stall.action fail: {message}; stopping this node")
        inner = ranks_of()  # a container's: the engine's client passes the SIGTERM on to it
        for pid in vitals.children(inner) if inner else []:  # a stopped rank ignores torchrun's SIGTERM until killed
            if vitals.STATES.get((vitals.proc_stat(pid) or ("",))[0], "").startswith("stopped"):
                _kill(pid, signal.SIGKILL)
        _kill(agent, signal.SIGTERM)
        timer = threading.Timer(jobcore.STOP_GRACE_S, _kill, (agent, signal.SIGKILL))  # torchrun stuck in its own stop
        timer.daemon = True  # never keeps the wrapper from ending
        timer.start()

    # Every rank is on this machine (in a container too: its pid as this machine sees it, which py-spy reads
    # from outside): when the first node's watch names a stall it reads where each one is, once
    # (``stacks.where``), kept beside watch.json.
    seat = jobcore.Seat(node=node, nodes=nodes, host="localhost", first=addr, port=port, timeout=timeout,
                        action=c.get("action", "report"), output=log,
                        metrics=os.environ.get("DDPJOB_METRICS_FILE") or None, watch_file=task.watch,
                        say=lambda text: _say(f"[ddpjob] {text}"))
    return jobcore.heartbeats(seat, on_stall=on_stall, sample=sampler.sample,
                              where=functools.partial(stacks.where, keep=task.stacks))


def _in_container(engine: str, name: str) -> Callable[[], int | None]:
    """The pid of the torchrun agent in container ``name``, as this machine's ``/proc`` sees it, for the
    sampler (None until the container runs): ``ENGINE inspect`` gives the pid of the container's init
    (``--init``), whose child is the agent (``sh -c '... exec "$@"'`` became torchrun). The engine is
    asked at most every 2 s until it answers, then never again."""
    from launcher.targets.shared import vitals

    found: list[int] = []
    asked = [0.0]

    def agent() -> int | None:
        if found or time.time() - asked[0] < 2.0:
            return found[0] if found else None
        import subprocess

        asked[0] = time.time()
        try:
            out = subprocess.run([engine, "inspect", "--format", "{{.State.Pid}}", name], capture_output=True,
                                 text=True, timeout=10, stdin=subprocess.DEVNULL, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        init = vitals.children(int(out)) if out.isdigit() and int(out) > 0 else []
        found.extend(init[:1])
        return found[0] if found else None

    return agent


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _record(exit_file: str, record: dict[str, object], *, create: bool) -> bool:
    """Write the record; a failure is said, never a reason to change the node's result."""
    try:
        write_record(exit_file, record, create=create)
    except OSError as e:
        _say(f"[ddpjob] could not write {exit_file}: {e}")
        return False
    return True


def _say(text: str) -> None:
    """A line in the node's log (its stderr); dropped when a full disk cannot take it."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def main(args: list[str]) -> int:
    unbuffered_output()
    cgroup = args[2] if len(args) > 3 and args[1] == "--cgroup" else None
    if cgroup:
        args = [args[0], *args[3:]]
    if len(args) < 3 or args[1] != "--":
        print("usage: python -I -S node.py EXIT_FILE [--cgroup DIR] -- ARGV...", file=sys.stderr)
        return 2
    return run(args[0], args[2:], cgroup)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
