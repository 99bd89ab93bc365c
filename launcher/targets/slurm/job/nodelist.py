"""Slurm's compressed node lists (``SLURM_JOB_NODELIST``) as host names, read on the nodes by the
node runner (``node.py``) and ``task_env.py``, and the rendezvous port derived from the job id
(``slurm_port``): standard library only, like all of ``job/``."""

from __future__ import annotations

import zlib

# Ports derived from the job id fall in this range (below the usual ephemeral range 32768+).
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000


def slurm_port(job_id: int | str, array_index: int | str | None = None) -> int:
    """A port derived from the Slurm job id (and array index) so concurrent jobs do not collide.

    Consecutive job ids map to consecutive ports; array elements are spread by a hash so that
    element k of job j and element 0 of job j+k do not meet.
    """
    key = f"{job_id}" if array_index in (None, "") else f"{job_id}_{array_index}"
    try:
        base = int(job_id)
    except (TypeError, ValueError):
        base = zlib.crc32(str(job_id).encode())
    offset = base if array_index in (None, "") else base + zlib.crc32(key.encode())
    return SLURM_PORT_BASE + offset % SLURM_PORT_SPAN


def expand_nodelist(text: str) -> list[str]:
    """``"n[1-3,5],gpu01"`` -> ``["n1", "n2", "n3", "n5", "gpu01"]`` (zero padding kept)."""
    hosts: list[str] = []
    i = 0
    text = text.strip()
    while i < len(text):
        prefixes = [""]
        while i < len(text) and text[i] != ",":
            if text[i] == "[":
                end = text.index("]", i)
                suffixes = []
                for part in text[i + 1:end].split(","):
                    if "-" in part:
                        lo, hi = part.split("-", 1)
                        suffixes += [f"{n:0{len(lo)}d}" for n in range(int(lo), int(hi) + 1)]
                    else:
                        suffixes.append(part)
                prefixes = [p + s for p in prefixes for s in suffixes]
                i = end + 1
            else:
                prefixes = [p + text[i] for p in prefixes]
                i += 1
        hosts += [p for p in prefixes if p]
        i += 1
    return hosts
