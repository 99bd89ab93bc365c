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


# torchrun's own log records (``E1125 17:29:47.920000 28853 torch/distributed/...py:1002] ...``).
_TORCH_LOG = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_RULE = "=" * 20


class AgentNoise:
    """What of a torchrun agent's own output (its lines without a rank) ``logs`` shows by default.

    The ranks' lines are the user's: of them only torch's known noise is hidden. Of the agent's: its
    log records (``E1125 ... torch/distributed/...] failed (exitcode: 1)``), torch's known noise
    (``is_known_noise``, hidden in the ranks' lines too), the frames of its
    tracebacks (a worker that failed or a signal makes every agent raise) and its "Root Cause"
    report between ``====`` rules; each traceback's last line stays, shortened to ``torchrun
    stopped: SignalException: ...``. ddpjob's root cause says which rank failed and how. Lines of
    anything else on the node (ddpjob's node runner, srun) pass. ``logs --verbose`` shows all.
    One instance per log stream: a traceback spans lines.
    """

    def __init__(self) -> None:
        self.in_traceback = self.in_report = self.after_traceback = False
        self.hidden = 0

    def show(self, text: str) -> str | None:
        """``text`` as shown (maybe shortened), or None to hide it."""
        out = self._show(text)
        self.hidden += out is None
        return out

    def _show(self, text: str) -> str | None:
        if is_known_noise(text):
            return None
        if self.after_traceback:  # a chained exception's words and the blank lines around them
            if not text.strip() or text.startswith(_CHAINED):
                return None
            self.after_traceback = False
        if self.in_report:
            self.in_report = not text.startswith(_RULE)
            return None
        if text.startswith(_RULE):
            self.in_report = True
            return None
        if self.in_traceback:
            if not text.strip() or text[:1].isspace() or text.startswith(_CHAINED) or text.startswith("Traceback ("):
                return None
            self.in_traceback, self.after_traceback = False, True
            name, sep, message = text.partition(":")
            return f"torchrun stopped: {name.rsplit('.', 1)[-1]}{sep}{message}".rstrip(": ")
        if text.startswith("Traceback (most recent call last):"):
            self.in_traceback = True
            return None
        return None if _TORCH_LOG.match(text) else text


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
    verbose: bool = False,
) -> Iterator[str]:
    """Yield formatted lines of every source; with ``follow``, keep going until ``finished()``.

    ``tail`` counts the lines shown: those of ``rank`` and, unless ``verbose``, without torchrun's
    own noise (``AgentNoise``), so ``--tail 3`` after a failure shows the last lines that matter.

    Files that do not exist yet are waited for. New sources returned by ``sources_fn`` (e.g. the
    next sweep element's nodes) are picked up while following. After ``finished()`` turns true,
    one last pass drains what was written before the end, including a final unterminated line.
    ``sleep(poll)`` waits between passes (it may end early, e.g. when the job's supervisor exits).
    """
    offsets: dict[str, int] = {}
    known: dict[str, LogSource] = {}
    noise: dict[str, AgentNoise] = {}

    def add(srcs: list[LogSource]) -> None:
        for s in srcs:
            known.setdefault(s.path, s)

    def drain(first: bool, final: bool) -> Iterator[str]:
        for path, src in list(known.items()):
            if path not in offsets:
                lines, end = read_lines(path, None, final)
            else:
                lines, end = _read_from(path, offsets[path], final)
            shown = _shown(src, lines, rank, None if verbose else noise.setdefault(path, AgentNoise()))
            if path not in offsets and tail is not None:
                shown = list(deque(shown, maxlen=tail)) if tail > 0 else []
            offsets[path] = end
            yield from shown

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


# torch's TCPStore server asks for the name of every client that connects (getnameinfo) and warns
# when the address has none: nodes on a container bridge or in the test cluster's namespaces have no
# reverse DNS for each other. Harmless (the store works by address), and one line per connection.
_UNNAMED_CLIENT = "[c10d] The hostname of the client socket cannot be retrieved. err="


def is_known_noise(text: str) -> bool:
    """A line torch writes that says nothing a user can act on (``_UNNAMED_CLIENT``): ``logs``
    hides it unless ``--verbose``; the node's log file keeps it."""
    return _UNNAMED_CLIENT in text


def is_progress_line(text: str) -> bool:
    """A rank's ``DDPJOB_PROGRESS {...}`` line (``launcher.core.progress``): read for progress,
    shown only by ``logs --verbose``."""
    return text.startswith("DDPJOB_PROGRESS {")


def hidden_rank_line(text: str) -> bool:
    """A rank's line that ``logs`` shows only with ``--verbose``: progress records and torch's known noise."""
    return is_progress_line(text) or is_known_noise(text)


def _shown(src: LogSource, lines: list[str], rank: int | None, noise: AgentNoise | None) -> list[str]:
    out = []
    for line in lines:
        local_rank, text = split_torchrun_prefix(line)
        if noise is not None and local_rank is None:
            kept = noise.show(line)
            if kept is None:
                continue
            line = kept
        elif noise is not None and hidden_rank_line(text):
            continue
        formatted = format_line(src, line, rank)
        if formatted is not None:
            out.append(formatted)
    return out


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
