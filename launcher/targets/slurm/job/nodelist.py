"""Slurm's compressed node lists (``SLURM_JOB_NODELIST``) as host names, read on the nodes by the
node runner (``node.py``) and ``task_env.py``: standard library only, like all of ``job/``."""

from __future__ import annotations


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
