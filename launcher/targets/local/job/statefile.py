"""The local supervisor's ``state.json``, kept when the disk is full.

The supervisor writes its state atomically (``launcher.targets.shared.files``). When it cannot (a
full disk, a quota), the state stays in memory and is written again at the next save, or at a retry
while a run goes on; the supervisor keeps supervising. Why the file is stale goes into
``supervisor.note``: a small file allocated when the supervisor starts and overwritten in place, so
it can be written on a full disk, which ``status`` shows (``read_note``). The supervisor's messages
go to ``supervisor.log`` on the same disk: one that cannot be written is dropped, never raised.

Standard library only: the supervisor runs as ``python -I -S``.
"""

from __future__ import annotations

import errno
import json
import sys
import time

from launcher.targets.local.job.staterecord import StateRecord, write_state
from launcher.targets.shared.runfolder import STATE, RunFolder

NOTE_SIZE = 1024  # bytes allocated up front; a note is far smaller
RETRY_EVERY = 1.0  # seconds between two tries of a state that could not be written


def say(text: str) -> None:
    """A line in the supervisor's log (its stderr); dropped when the disk cannot take it."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class StateFile:
    """``state.json`` of one run directory, and the note that says why it is stale."""

    def __init__(self, run_dir: str) -> None:
        folder = RunFolder(run_dir)
        self.path, self.note = folder.state, folder.stale_note
        self.failed: str | None = None  # why the last write failed; None when the file is current
        self.passing = False  # whether that failure is one that time can cure (a full disk, a quota)
        self.ended = False  # whether the note says the job has ended
        self.tried = 0.0
        try:
            with open(self.note, "wb") as f:
                f.write(b" " * NOTE_SIZE)
            self.has_note = True
        except OSError:
            self.has_note = False

    def save(self, state: StateRecord) -> bool:
        """Write ``state``; False when it could not be (it is tried again by the next save or retry)."""
        self.tried = time.monotonic()
        try:
            write_state(self.path, state)
        except OSError as e:
            reason = f"could not write {STATE}: {e.strerror or e}"
            if reason != self.failed:
                say(f"[ddpjob] {reason}; the supervisor keeps the state in memory and writes it when it can")
            ended = state.ended is not None
            if reason != self.failed or ended != self.ended:  # the job's end too: status says it has ended
                note: dict[str, str | float] = {"reason": reason, "since": time.time()}
                if ended:
                    note["ended"] = state.state + (f": {state.message}" if state.message else "")
                self._write_note(note)
            self.failed, self.ended = reason, ended
            self.passing = e.errno in (errno.ENOSPC, errno.EDQUOT)
            return False
        if self.failed is not None:
            self.failed = None
            self._write_note(None)
            say(f"[ddpjob] {STATE} is written again")
        return True

    def retry(self, state: StateRecord) -> None:
        """Write ``state`` again if the last write failed, at most once per ``RETRY_EVERY`` seconds."""
        if self.failed is not None and time.monotonic() - self.tried >= RETRY_EVERY:
            self.save(state)

    def _write_note(self, note: dict[str, str | float] | None) -> None:
        if not self.has_note:
            return
        data = json.dumps(note).encode()
        # a long message: cut, still JSON
        if len(data) > NOTE_SIZE and note is not None and isinstance(ended := note.get("ended"), str):
            note = {**note, "ended": ended[:NOTE_SIZE // 2] + "..."}
            data = json.dumps(note).encode()
        data = data[:NOTE_SIZE].ljust(NOTE_SIZE)
        try:
            with open(self.note, "r+b") as f:  # in place: no new block is needed
                f.write(data)
        except OSError:
            pass


def read_note(run_dir: str) -> str | None:
    """Why the supervisor's ``state.json`` is stale, or None when it is current; with how the job
    ended when it has (the supervisor waits to write that)."""
    try:
        with open(RunFolder(run_dir).stale_note, "rb") as f:
            note = json.loads(f.read().decode("utf-8", "replace").strip() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict) or not note.get("reason"):
        return None
    return str(note["reason"]) + (f" (the job has ended, {note['ended']})" if note.get("ended") else "")
