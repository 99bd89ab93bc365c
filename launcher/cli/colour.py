"""Colour on a terminal: each rank's line prefix in its own colour, job states by what they mean.

Only when the stream is a terminal, ``$NO_COLOR`` is unset or empty (https://no-color.org) and
``$TERM`` is not ``dumb``; piped or redirected output stays plain text. Imports nothing heavy.
"""

from __future__ import annotations

import os
import re
from typing import TextIO

_RESET = "\033[0m"
# Distinct on dark and light backgrounds; ranks cycle through them.
_PREFIX_COLOURS = ("\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[34m", "\033[91m", "\033[96m", "\033[93m")
_STATE_COLOURS = {"SUCCEEDED": "\033[32m", "FAILED": "\033[31;1m", "CANCELLED": "\033[33m",
                  "RUNNING": "\033[36m", "PENDING": "\033[2m", "UNKNOWN": "\033[35m"}
_PREFIX = re.compile(r"^\[([^\]\n]{1,80})\]")
_RANK = re.compile(r"rank(\d+)")


def enabled(stream: TextIO) -> bool:
    """Whether to colour what goes to ``stream``."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def line(text: str, on: bool) -> str:
    """A log line with its ``[node1 rank3]`` prefix coloured by rank (by the prefix's text when it
    names no rank: ``[master-0]``, ``[ddpjob]``)."""
    m = _PREFIX.match(text) if on else None
    if m is None:
        return text
    rank = _RANK.search(m.group(1))
    index = int(rank.group(1)) if rank else sum(m.group(1).encode())
    return f"{_PREFIX_COLOURS[index % len(_PREFIX_COLOURS)]}{m.group(0)}{_RESET}{text[m.end():]}"


def state(text: str, value: str, on: bool) -> str:
    """``text`` (a state, or a cell holding one, padded already) in the colour of state ``value``."""
    code = _STATE_COLOURS.get(value) if on else None
    return f"{code}{text}{_RESET}" if code else text
