"""Checks shared by the spec's common fields and the targets' sections (``targets/*/options.py``).

A leaf module (it imports nothing from ddpjob), so every options model can use it without an
import cycle through ``launcher.spec.model``.
"""

from __future__ import annotations

import re

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables torchrun (or the launcher, per target) computes itself. A user value would be wrong on
# every node but one, so the spec refuses them instead of letting them win.
RESERVED_ENV = frozenset(
    {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "DDPJOB_SWEEP_INDEX", "DDPJOB_JOB_ID",
        "DDPJOB_OUTPUT_DIR", "DDPJOB_METRICS_FILE", "DDPJOB_RESTART_COUNT",
    }
)


# The most CPU cores one node's request may name (resources.cpus, k8s.cpu): more than any machine has,
# and small enough for every place a count of cores goes.
MAX_CPUS = 4096

# The largest count a command line option takes (``logs --tail``, ``list --limit``): more lines
# or jobs than anyone has, and small enough for every place a count goes (a deque, SQLite's LIMIT).
COUNT_MAX = 1_000_000_000


def is_reserved_env(name: str) -> bool:
    """Set per process by torchrun, ddpjob or an operator (``PET_*``): never by a spec."""
    return name in RESERVED_ENV or name.startswith("PET_")


def control_problem(value: str, what: str) -> str | None:
    """Why ``value`` cannot be an argument or variable (a NUL byte, a line break, another control
    character such as ESC, which would also rewrite the terminal of whoever lists the job), or None."""
    if "\x00" in value:
        return f"{what} contains a NUL byte, which no process argument or variable can hold"
    if "\n" in value or "\r" in value:
        return f"{what} contains a line break; put multi-line content in a file and pass its path"
    bad = next((c for c in value if (ord(c) < 32 and c != "\t") or 127 <= ord(c) < 160), None)
    if bad is not None:
        return f"{what} contains the control character {bad!r}"
    return None


def no_control(value: str, what: str) -> str:
    """Refuse NUL bytes, line breaks and other control characters (tabs are fine)."""
    problem = control_problem(value, what)
    if problem:
        raise ValueError(problem)
    return value
