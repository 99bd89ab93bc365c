"""A build context: the folder's entries after ``.ddpjobignore`` (else ``.dockerignore``), their content
hash, and a staged copy that holds exactly those entries for the engine.

The ignore files use ``.dockerignore``'s syntax: one pattern per line, ``#`` comments, ``*`` and ``?``
within one path segment, ``**`` across segments, ``!`` to take a path back; the last matching line
wins, and a pattern that matches a folder leaves out everything in it. The engine is given the staged
copy (hard links where possible), so what is hashed is exactly what is built, whichever ignore file
was used and whichever engine builds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

IGNORE_FILES = (".ddpjobignore", ".dockerignore")
# Without an ignore file: what never belongs in an image and changes on every commit or run.
DEFAULT_IGNORES = (".git", ".venv", "**/__pycache__", "**/*.pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache")
HASH_FORMAT = "ddpjob-build-1"


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    keep: bool  # a ``!`` line: the path is taken back


def _translate(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[" and (end := pattern.find("]", i + 1)) > i + 1:
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out, i = out + "[" + body.replace("\\", "\\\\") + "]", end + 1
        else:
            out, i = out + re.escape(c), i + 1
    return re.compile(out + r"\Z")


def parse_rules(text: str) -> list[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        line = line[1:].strip() if keep else line
        line = os.path.normpath(line.lstrip("/")) if line.lstrip("/") else ""
        if line and line != ".":
            rules.append(Rule(_translate(line), keep))
    return rules


def excluded(rel: str, rules: list[Rule]) -> bool:
    """Whether ``rel`` (``a/b/c``) is left out: the last rule matching it or one of its folders."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    out = False
    for rule in rules:
        if any(rule.pattern.match(p) for p in prefixes):
            out = not rule.keep
    return out


@dataclass
class Entry:
    rel: str
    kind: str  # "f" file, "d" folder, "l" symbolic link
    mode: int
    size: int = 0
    digest: str = ""  # a file's sha256, a link's target


@dataclass
class Context:
    """The entries of a context, sorted by path, and where their rules came from."""

    root: Path
    entries: list[Entry] = field(default_factory=list)
    ignore_file: str | None = None

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def largest(self, count: int = 5) -> list[Entry]:
        return sorted((e for e in self.entries if e.kind == "f"), key=lambda e: (-e.size, e.rel))[:count]


def rules_of(root: Path) -> tuple[list[Rule], str | None]:
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            return parse_rules(path.read_text(errors="replace")), name
    return parse_rules("\n".join(DEFAULT_IGNORES)), None


def scan(root: Path, *, limit: int | None = None) -> Context:
    """The context's entries (contents hashed only when the total stays within ``limit``)."""
    rules, ignore_file = rules_of(root)
    prune = not any(r.keep for r in rules)  # without ``!`` lines a left-out folder is not entered
    ctx = Context(root, ignore_file=ignore_file)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        dirnames.sort()
        for name in list(dirnames):
            rel, full = base + name, os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                dirnames.remove(name)  # a link to a folder is a link, as the engines copy it
                if not excluded(rel, rules):
                    ctx.entries.append(Entry(rel, "l", 0o777, 0, os.readlink(full)))
            elif excluded(rel, rules):
                if prune:
                    dirnames.remove(name)
            else:
                ctx.entries.append(Entry(rel, "d", stat.S_IMODE(st.st_mode)))
        for name in sorted(filenames):
            rel, full = base + name, os.path.join(dirpath, name)
            if excluded(rel, rules):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                ctx.entries.append(Entry(rel, "l", 0o777, 0, os.readlink(full)))
            elif stat.S_ISREG(st.st_mode):
                ctx.entries.append(Entry(rel, "f", stat.S_IMODE(st.st_mode), st.st_size))
    ctx.entries.sort(key=lambda e: e.rel)
    if limit is None or ctx.size <= limit:
        for e in ctx.entries:
            if e.kind == "f":
                e.digest = _file_sha(root / e.rel)
    return ctx


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_tag(base: str, dockerfile: str, ctx: Context) -> str:
    """``ctx-<24 hex>``: a hash of the base reference, the Dockerfile's text and every entry."""
    h = hashlib.sha256()
    for line in (HASH_FORMAT, f"base {base}", f"dockerfile {hashlib.sha256(dockerfile.encode()).hexdigest()}"):
        h.update(line.encode() + b"\n")
    for e in ctx.entries:
        h.update(f"{e.kind} {e.mode:o} {e.rel}\0{e.digest}\n".encode(errors="surrogateescape"))
    return "ctx-" + h.hexdigest()[:24]


def stage(ctx: Context, into: Path) -> None:
    """A copy of the context's entries under ``into`` (hard links where the filesystem allows)."""
    into.mkdir(parents=True, exist_ok=True)
    for e in ctx.entries:
        src, dst = ctx.root / e.rel, into / e.rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if e.kind == "d":
            dst.mkdir(exist_ok=True)
        elif e.kind == "l":
            os.symlink(e.digest, dst)
        else:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
    for e in reversed(ctx.entries):  # folders' own modes last: a read-only one is filled first
        if e.kind == "d":
            os.chmod(into / e.rel, e.mode)


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
