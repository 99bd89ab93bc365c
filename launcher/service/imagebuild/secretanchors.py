"""The content scan's prefilter: which of its rules' anchors (``secretscan.Rule.needs``: literals,
one of which every finding of the rule holds) a file holds, so that a rule's expressions run only
on the few files holding one of its anchors.

With the optional ``ahocorasick_rs`` installed (``pip install ahocorasick-rs``: Rust's aho-corasick,
whose SIMD search finds a few dozen literals in one pass, ~7 GB/s here, and releases the GIL while it
searches), every anchor is found in one pass over the file. Without it ``secretscan`` tests each
rule's gate on its own (a C-speed ``in``, ~2-3 GB/s each). Both ways run the same rules on the same
files (the pure-Python way alone skips a table of numbers, ``secretscan.NUMBERS``, as the one pass
costs less than telling one): a leftmost-first search reports no match inside another, so an anchor
that can overlap one found is looked for again on its own.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from types import ModuleType

_ac: ModuleType | None
try:  # optional: the pure-Python way below gives the same answers, more slowly
    _ac = importlib.import_module("ahocorasick_rs")
except ImportError:  # pragma: no cover - depends on what is installed
    _ac = None


def matcher() -> str:
    """Which way anchors are found: "ahocorasick_rs" (one pass) or "python" (a pass per rule)."""
    return "python" if _ac is None else "ahocorasick_rs"


def positions(text: bytes, literal: bytes) -> list[int]:
    """Where each occurrence of ``literal`` starts in ``text`` (non-overlapping, left to right)."""
    out, at = [], text.find(literal)
    while at >= 0:
        out.append(at)
        at = text.find(literal, at + len(literal))
    return out


def _can_overlap(a: bytes, b: bytes) -> bool:
    """Whether an occurrence of ``a`` and one of ``b`` can share a byte."""
    return (a in b or b in a or any(a.endswith(b[:k]) for k in range(1, len(b)))
            or any(b.endswith(a[:k]) for k in range(1, len(a))))


class Anchors:
    """One search for a set of anchors. ``found(text)``, where ``one_pass``: each anchor ``text``
    holds -> where it starts (every occurrence for the ``positioned`` anchors, at least one for the
    others)."""

    def __init__(self, anchors: Iterable[bytes], positioned: Iterable[bytes] = ()) -> None:
        self.anchors = tuple(dict.fromkeys(anchors))
        self.positioned = frozenset(positioned)
        self.overlaps = {a: tuple(b for b in self.anchors if b != a and _can_overlap(a, b)) for a in self.anchors}
        self._search = None if _ac is None else _ac.BytesAhoCorasick(
            self.anchors, matchkind=_ac.MatchKind.LeftmostFirst)  # leftmost-first: the SIMD search

    @property
    def one_pass(self) -> bool:
        return self._search is not None

    def found(self, text: bytes) -> dict[bytes, list[int]]:
        assert self._search is not None, "one_pass only"
        out: dict[bytes, list[int]] = {}
        for index, start, _ in self._search.find_matches_as_indexes(text):
            out.setdefault(self.anchors[index], []).append(start)
        for a in list(out):  # a match hides any occurrence it overlaps: look for those on their own
            for b in self.overlaps[a]:
                if b in self.positioned or b not in out:
                    where = positions(text, b) if b in self.positioned else [text.find(b)]
                    if where and where[0] >= 0:
                        out[b] = where
        return out


@functools.lru_cache(maxsize=8)
def anchors(literals: tuple[bytes, ...], positioned: tuple[bytes, ...] = ()) -> Anchors:
    return Anchors(literals, positioned)
