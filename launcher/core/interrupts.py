"""Ctrl-C held over the steps that must not be cut in the middle."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[list[int]]:
    """Hold Ctrl-C from reservation to recorded handle, so a job is either not submitted at all or
    recorded with its handle; the caller learns of a held Ctrl-C from the yielded list. The window
    is bounded by the targets' own timeouts (sbatch, API calls)."""
    caught: list[int] = []
    # Not from another thread (Python allows handlers only in the main one), and not when Ctrl-C is
    # ignored (nohup, a background job): an ignored SIGINT stays ignored, here as everywhere else.
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def interrupt_after() -> Iterator[None]:
    """Hold Ctrl-C over a short step that cannot be interrupted cleanly, then raise it.

    Pydantic builds a model's validator in Rust the first time the model is used; a KeyboardInterrupt
    raised in the middle comes out as a ``SchemaError`` ("internal error") instead of a Ctrl-C. The
    spec's validation (tens of milliseconds) runs under this, and a Ctrl-C then goes to the handler
    that was in place: Python's raises KeyboardInterrupt (ddpjob stops as anywhere else); a program
    using ``launcher.api`` with its own handler gets it there."""
    held: list[int] = []
    try:
        with deferred_interrupt() as caught:
            held = caught
            yield
    finally:
        if held:
            signal.raise_signal(signal.SIGINT)
