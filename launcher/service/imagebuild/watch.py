"""The engine's long calls (pull, build, push) as watched processes.

1. A pull or a push that makes no progress for ``no_progress_limit()`` seconds (default 90,
   ``$DDPJOB_BUILD_NO_PROGRESS_S``) is stopped and raises ``Stalled`` naming the registry: a
   registry that stops answering mid-push no longer holds ``build`` for the hour of the overall
   limit. Progress is a line the engine prints, or ``PROGRESS_BYTES`` more read or written (its
   ``/proc/PID/io`` counters: a blob going out is read from storage as it is sent, and a stalled
   socket stops both; an idle podman still moves a few bytes a second, which do not count).
2. Ctrl-C: the engine runs in its own session, so the terminal's SIGINT reaches ddpjob only;
   ddpjob then stops the engine (SIGTERM, SIGKILL after ``STOP_GRACE_S``) and, for a build,
   removes what the engine leaves when stopped: its working containers (``ps -a --external``) and
   the runtime's containers of its RUN steps, started after the build began. Neither carries a mark
   of the build that made it, so when another image build runs on the machine at that moment (a
   ``podman build``, a ``buildah`` build), nothing is removed: the containers are named on stderr,
   with the commands that remove them once that build has ended. Then the ``KeyboardInterrupt``
   goes on (exit 130).
Arguments are lists, never a shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from launcher.core.errors import TargetUnavailable, UsageError

NO_PROGRESS_ENV = "DDPJOB_BUILD_NO_PROGRESS_S"
DEFAULT_NO_PROGRESS_S = 90.0
STOP_GRACE_S = 10.0
POLL_S = 0.5
PROGRESS_BYTES = 64 << 10


class Stalled(TargetUnavailable):
    """The engine made no progress for the no-progress limit (a registry that stopped answering)."""


def no_progress_limit() -> float:
    """Seconds without progress after which a pull or push is stopped (``$DDPJOB_BUILD_NO_PROGRESS_S``)."""
    text = os.environ.get(NO_PROGRESS_ENV, "").strip()
    if not text:
        return DEFAULT_NO_PROGRESS_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise UsageError(f"${NO_PROGRESS_ENV}={text!r} is not a number of seconds (0 < s <= 86400); "
                         f"unset it for the default ({DEFAULT_NO_PROGRESS_S:g} s)")
    return value


def _io(pid: int) -> int:
    """The process's bytes read and written so far (0 where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields.get("rchar", 0)) + int(fields.get("wchar", 0))
    except (OSError, ValueError):
        return 0


def run(argv: Sequence[str], *, timeout: float, no_progress: float | None = None, stalled: str = "",
        on_interrupt: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end and return its output, like ``subprocess.run(capture_output=True)``.

    ``no_progress``: stop it after that many seconds without a line or ``PROGRESS_BYTES`` of I/O and raise ``Stalled``
    with ``stalled`` (the message) and the limit; ``timeout``: stop it then in any case
    (``subprocess.TimeoutExpired``). ``on_interrupt``: called after the process is stopped on Ctrl-C."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    last = [time.monotonic()]

    def drain(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)
            last[0] = time.monotonic()

    readers = [threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err), daemon=True)]
    for t in readers:
        t.start()
    start, seen = time.monotonic(), _io(proc.pid)
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            now, io = time.monotonic(), _io(proc.pid)
            if io - seen >= PROGRESS_BYTES:
                seen, last[0] = io, now
            if now - start > timeout:
                stop(proc)
                raise subprocess.TimeoutExpired(list(argv), timeout)
            if no_progress is not None and now - last[0] > no_progress:
                stop(proc)
                raise Stalled(f"{stalled} made no progress for {no_progress:g} s and was stopped (the limit: "
                              f"${NO_PROGRESS_ENV}); check that the registry answers, then run the same command again")
    except KeyboardInterrupt:
        stop(proc)
        if on_interrupt is not None:
            on_interrupt()
        raise
    for t in readers:
        t.join(timeout=5)
    return subprocess.CompletedProcess(list(argv), proc.returncode, "".join(out), "".join(err))


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after ``STOP_GRACE_S``; waits for the end. A second Ctrl-C meanwhile
    goes straight to SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------- a stopped build's leftovers
def leftovers(engine: str) -> set[str]:
    """What a stopped build can leave: the engine's external (working) containers and the OCI
    runtimes' containers of RUN steps (``buildah-*``), as ``kind:id`` strings."""
    found: set[str] = set()
    # Only the build's working containers (the engine shows them in state "storage"): a container
    # the user (or a job) created meanwhile is none of the build's business.
    listed = _quiet([engine, "ps", "-a", "--external", "--format", "{{.ID}} {{.State}}"])
    for line in listed.splitlines():
        cid, _, state = line.strip().partition(" ")
        if cid and state.strip().lower() == "storage":
            found.add(f"ctr:{cid}")
    for runtime in ("runc", "crun"):
        path = shutil.which(runtime)
        if path is None:
            continue
        with contextlib.suppress(ValueError):
            for c in json.loads(_quiet([path, "list", "--format", "json"]) or "null") or []:
                if isinstance(c, dict) and str(c.get("id", "")).startswith("buildah-"):
                    found.add(f"{runtime}:{c['id']}:{c.get('bundle', '')}")
    return found


def clean(engine: str, before: set[str]) -> None:
    """Remove what ``leftovers`` finds now and did not find in ``before``: the RUN step's
    container (and its bundle folder), then the working container. While another build runs
    (``other_builds``) they may be its: they are named on stderr and left."""
    new = sorted(leftovers(engine) - before, key=lambda s: (s.startswith("ctr:"), s))
    if not new:
        return
    others = other_builds(engine)
    if others:
        print(left_note(engine, new, others), file=sys.stderr)
        return
    for item in new:
        kind, cid, bundle = _split(item)
        if kind == "ctr":
            _quiet([engine, "rm", "-f", cid])
            continue
        path = shutil.which(kind)
        if path:
            _quiet([path, "delete", "-f", cid])
        if bundle and os.path.basename(bundle).startswith("buildah") and os.path.isdir(bundle):
            shutil.rmtree(bundle, ignore_errors=True)


def left_note(engine: str, items: Sequence[str], others: Sequence[int]) -> str:
    """What a stopped build says of the containers it left because another build was running."""
    commands = []
    for kind, cid, bundle in map(_split, items):
        if kind == "ctr":
            commands.append(f"{engine} rm -f {shlex.quote(cid)}")
        else:
            commands.append(f"{kind} delete -f {shlex.quote(cid)}" + (f" && rm -rf {shlex.quote(bundle)}" if bundle else ""))
    pids = ", ".join(str(p) for p in others)
    return (f"another image build is running on this machine (pid {pids}), so the {len(items)} container(s) that "
            "appeared while this one ran were left: they may be that build's (no container says which build made "
            "it). Once it has ended, remove them with:\n  " + "\n  ".join(commands))


def _split(item: str) -> tuple[str, str, str]:
    """A ``leftovers`` item as (kind, id, bundle): ``ctr`` (a working container, no bundle) or the runtime."""
    kind, _, rest = item.partition(":")
    cid, _, bundle = rest.partition(":") if kind != "ctr" else (rest, "", "")
    return kind, cid, bundle


BUILD_WORDS = {"build", "bud"}


def other_builds(engine: str) -> list[int]:
    """Pids of image builds running now, this process's own excluded: ``ENGINE ... build`` or
    ``buildah ... build|bud|from``. A false match only means containers are left and named. Where
    there is no /proc to read (macOS, where the engine runs in a VM), none is found."""
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if not argv:
            continue
        name = os.path.basename(argv[0])
        words = set(argv[1:])
        if (name == engine and words & BUILD_WORDS) or (name == "buildah" and words & (BUILD_WORDS | {"from"})):
            found.append(int(entry))
    return sorted(found)


def _quiet(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                              stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
