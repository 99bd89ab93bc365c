"""Where ddpjob keeps its files: ``$DDPJOB_HOME`` or ``~/.ddpjob``."""

from __future__ import annotations

import os
from pathlib import Path


def ddpjob_home() -> Path:
    """The folder holding the registry, the run directories and cached CRDs."""
    return Path(os.environ.get("DDPJOB_HOME") or Path.home() / ".ddpjob").expanduser()


_USER_UMASK: list[int] = []  # the umask ddpjob started with, before ``private_files`` narrowed it


def private_files() -> None:
    """From now on this process (and what it starts) creates files only its user can read: the
    registry, plans and logs may hold secrets. The umask it had is kept for ``user_umask``."""
    old = os.umask(0o077)
    os.umask(old | 0o077)
    _USER_UMASK[:] = [old]


def user_umask() -> int:
    """The umask the user gave ddpjob: files made for them to share (a plot) follow it."""
    if _USER_UMASK:
        return _USER_UMASK[0]
    now = os.umask(0o077)
    os.umask(now)
    return now
