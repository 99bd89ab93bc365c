"""Where ddpjob keeps its files: ``$DDPJOB_HOME`` or ``~/.ddpjob``."""

from __future__ import annotations

import os
from pathlib import Path


def ddpjob_home() -> Path:
    """The folder holding the registry, the run directories and cached CRDs."""
    return Path(os.environ.get("DDPJOB_HOME") or Path.home() / ".ddpjob").expanduser()
