"""One node of a local job: ``python -m launcher.targets.local.node EXIT_FILE -- torchrun argv...``.

The supervisor starts each torchrun agent through this small wrapper, which runs the agent as its
child, passes on the signals that stop it, and writes how the agent ended to ``EXIT_FILE``
(``{"exit_code": 0, "signal": null, "ended": ...}``). The record is the job's truth when the
supervisor itself is gone (SIGKILL, the OOM killer): the agents and their workers run on, and
``status`` reads the records once they end. The file is allocated when the node starts and
overwritten in place at the end, so the record can be written even on a full disk.

Standard library only: it starts once per node and must cost nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

RECORD_SIZE = 256  # bytes allocated up front; a record is far smaller


def write_record(path: str, record: dict[str, Any], *, create: bool = False) -> None:
    """Write ``record`` padded to ``RECORD_SIZE`` bytes: created once, then overwritten in place."""
    data = json.dumps(record, sort_keys=True).encode().ljust(RECORD_SIZE)
    with open(path, "wb" if create else "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_record(path: str) -> dict[str, Any] | None:
    """The record, or None when the node has not written one (not started, or still running)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8", "replace").strip() or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("exit_code") is not None else None


def run(exit_file: str, argv: list[str]) -> int:
    write_record(exit_file, {"exit_code": None, "started": time.time()}, create=True)
    try:
        child = subprocess.Popen(argv)
    except OSError as e:
        print(f"[ddpjob] cannot start {argv[0]}: {e}", file=sys.stderr, flush=True)
        write_record(exit_file, {"exit_code": 127, "signal": None, "ended": time.time(), "error": str(e)})
        return 127

    def forward(signum: int, frame: Any) -> None:
        try:
            child.send_signal(signum)  # torchrun stops its workers on SIGTERM
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    sig_name = signal.Signals(-code).name if code < 0 else None
    try:
        write_record(exit_file, {"exit_code": code, "signal": sig_name, "ended": time.time()})
    except OSError as e:  # the record is a help, never a reason to change the node's result
        print(f"[ddpjob] could not write {exit_file}: {e}", file=sys.stderr)
    return 128 - code if code < 0 else code


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m launcher.targets.local.node EXIT_FILE -- ARGV...", file=sys.stderr)
        return 2
    return run(args[0], args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
