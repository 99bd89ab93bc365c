"""Memory quantities: the one parser behind every memory field of the spec and the Slurm target.

Two spellings exist, and each field says which it takes:

- ``quantity`` (``resources.memory``, ``resources.shm``): Kubernetes quantities. ``Ki Mi Gi Ti Pi Ei``
  are binary, ``k M G T P E`` decimal, a bare number is bytes.
- ``sbatch`` (``slurm.memory``): sbatch ``--mem``. ``K M G T`` are binary (1G = 1024M), ``Ki Mi
  Gi Ti`` are accepted as the same, a bare number is megabytes.

Both give bytes, so a spec means the same memory on every target, and ``slurm_mem`` writes any
valid value in the form sbatch takes. Values outside what a node can have are refused here, as
spec errors, instead of failing later inside a target.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Literal

Dialect = Literal["quantity", "sbatch"]

_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")
_K8S_UNITS = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_SLURM_UNITS = {
    "": 2**20, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}
_EXAMPLES = {"quantity": "'512Mi', '16Gi' or '2G'", "sbatch": "'16G', '16Gi' or '512M'"}
# The largest machines sold have a few tens of TiB; more than this per node is a typo.
MAX_BYTES = 64 * 2**40
# Less than this per node cannot run a Python process: a bare number meant as MB or GB, most likely.
MIN_BYTES = 2**20
# More digits than this is no size anyone means (64Ti in bytes has 14); the value is not computed.
MAX_DIGITS = 40


class QuantityError(ValueError):
    """Not a memory quantity of the field's spelling, or out of range. The message says which."""


def parse_memory(text: str, dialect: Dialect = "quantity") -> int:
    """Bytes of a memory quantity, e.g. ``parse_memory('2Gi') == 2**31``.

    Raises:
        QuantityError: malformed, unknown unit, or outside ``MIN_BYTES..MAX_BYTES``.
    """
    units = _K8S_UNITS if dialect == "quantity" else _SLURM_UNITS
    m = _RE.match(str(text).strip())
    if not m or m.group(2) not in units:
        raise QuantityError(f"must be a memory size such as {_EXAMPLES[dialect]}")
    number, unit = m.group(1), m.group(2)
    shown = shorten(str(text).strip())
    digits = len(number) - number.count(".")
    if digits > MAX_DIGITS:
        # Exact arithmetic (no float): a float of 2,000 digits is infinity, and ceil(inf) an OverflowError.
        raise QuantityError(f"{shown} has {digits} digits, more than any memory size needs (at most "
                            f"{MAX_DIGITS}); write e.g. {_EXAMPLES[dialect]}")
    value = math.ceil(Fraction(number) * units[unit])
    if value > MAX_BYTES:
        raise QuantityError(f"{shown} is more memory than any node has (at most 64Ti per node); "
                            f"write e.g. {_EXAMPLES[dialect]}")
    if value < MIN_BYTES:
        why = " (a bare number is bytes)" if dialect == "quantity" and not unit else ""
        raise QuantityError(f"{shown} is less than 1Mi{why}, too little for any process; "
                            f"write e.g. {_EXAMPLES[dialect]}")
    return value


def shorten(text: str, keep: int = 24) -> str:
    """A value as a message quotes it: a long one cut in the middle, saying how long it was."""
    if len(text) <= keep:
        return text
    return f"{text[:keep // 2]}...{text[-keep // 2:]} ({len(text)} characters)"


def slurm_mem(nbytes: int) -> str:
    """``sbatch --mem`` for a number of bytes: whole T or G when exact, else megabytes rounded up."""
    for unit, size in (("T", 2**40), ("G", 2**30)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{math.ceil(nbytes / 2**20)}M"
