"""Reading and following log files, shared by targets whose logs are files (local, Slurm).

torchrun with ``--tee 3`` prefixes each worker line with ``[<role><local_rank>]:`` (e.g.
``[default0]:``). ``rank_of_line`` turns that into the global rank for a node, so every line
can be traced to its node and rank.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_TORCHRUN_PREFIX = re.compile(r"^\[([A-Za-z_]+?)(\d+)\]:")
_TAIL_CHUNK = 64 * 1024  # read_lines with a tail reads this much of the end first


@dataclass(frozen=True)
class LogSource:
    """One log file and the label its lines get; ``node`` and ``procs`` let ranks be computed."""

    path: str
    label: str
    node: int | None = None
    procs_per_node: int = 1
    task: int | None = None


def split_torchrun_prefix(line: str) -> tuple[int | None, str]:
    """``[default1]:text`` -> (1, 'text'); a line without the prefix -> (None, line)."""
    m = _TORCHRUN_PREFIX.match(line)
    if not m:
        return None, line
    return int(m.group(2)), line[m.end():]


def format_line(src: LogSource, line: str, rank_filter: int | None) -> str | None:
    """The line with its origin as a prefix, or None when ``rank_filter`` excludes it."""
    local_rank, text = split_torchrun_prefix(line)
    if local_rank is not None and src.node is not None:
        rank = src.node * src.procs_per_node + local_rank
        if rank_filter is not None and rank != rank_filter:
            return None
        return f"[{src.label} rank{rank}] {text}"
    if rank_filter is not None:
        return None  # agent lines belong to no rank
    return f"[{src.label}] {text}"


def read_lines(path: str, tail: int | None, final: bool = False) -> tuple[list[str], int]:
    """Lines of ``path`` (the last ``tail`` if given) and the offset after them.

    A last line without a newline is left for later unless ``final`` (the writer has finished).
    """
    start = 0
    try:
        with open(path, "rb") as f:
            if tail is None:
                data = f.read()
            else:  # only the end of the file: a long log costs no more than a short one (the dashboard polls it)
                size = os.fstat(f.fileno()).st_size
                chunk = _TAIL_CHUNK
                while True:
                    start = max(0, size - chunk)
                    f.seek(start)
                    data = f.read()
                    if start == 0 or data.count(b"\n") > tail:
                        break
                    chunk *= 4
                if start:  # drop the partial line the chunk starts in
                    cut = data.index(b"\n") + 1
                    data, start = data[cut:], start + cut
    except FileNotFoundError:
        return [], 0
    end = len(data) if final else data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8", "replace").splitlines()
    if tail is not None:
        lines = list(deque(lines, maxlen=tail)) if tail > 0 else []
    return lines, start + end


def follow_files(
    sources: list[LogSource],
    *,
    tail: int | None,
    rank: int | None,
    follow: bool,
    finished: Callable[[], bool],
    poll: float = 0.1,
    sources_fn: Callable[[], list[LogSource]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Yield formatted lines of every source; with ``follow``, keep going until ``finished()``.

    Files that do not exist yet are waited for. New sources returned by ``sources_fn`` (e.g. the
    next sweep element's nodes) are picked up while following. After ``finished()`` turns true,
    one last pass drains what was written before the end, including a final unterminated line.
    ``sleep(poll)`` waits between passes (it may end early, e.g. when the job's supervisor exits).
    """
    offsets: dict[str, int] = {}
    known: dict[str, LogSource] = {}

    def add(srcs: list[LogSource]) -> None:
        for s in srcs:
            known.setdefault(s.path, s)

    def drain(first: bool, final: bool) -> Iterator[str]:
        for path, src in list(known.items()):
            if path not in offsets:
                lines, end = read_lines(path, tail if first else None, final)
                offsets[path] = end
            else:
                lines, end = _read_from(path, offsets[path], final)
                offsets[path] = end
            for line in lines:
                out = format_line(src, line, rank)
                if out is not None:
                    yield out

    add(sources)
    yield from drain(first=True, final=not follow)
    if not follow:
        return
    while True:
        done = finished()
        if sources_fn is not None:
            add(sources_fn())
        yield from drain(first=False, final=done)
        if done:
            return
        sleep(poll)


def _read_from(path: str, offset: int, final: bool) -> tuple[list[str], int]:
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return [], offset
    if size < offset:  # truncated or replaced: start over
        offset = 0
    if size == offset:
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = len(data) if final else data.rfind(b"\n") + 1
    text = data[:end].decode("utf-8", "replace")
    return text.splitlines(), offset + end
