"""A build context: the folder's entries after ``.ddpjobignore`` (else ``.dockerignore``; their
syntax: ``ignores``), their content hash, and a staged copy that holds exactly those entries for the
engine.

The engine is given the staged copy (hard links where possible), so what is hashed is exactly what
is built, whichever ignore file was used and whichever engine builds. The modes hashed are the modes
staged: every file and folder readable by any user of the image (its files belong to root there),
executable where the owner's copy is, and without set-id bits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from launcher.service.imagebuild.ignores import excluded, rules_of

HASH_FORMAT = "ddpjob-build-2"  # 2: modes as staged


@dataclass
class Entry:
    rel: str
    kind: str  # "f" file, "d" folder, "l" symbolic link
    mode: int  # as staged (``image_mode``)
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


def image_mode(kind: str, mode: int) -> int:
    """The mode a path has in the image: readable (folders: enterable) by every user, runnable by
    every user where it is runnable at all, no set-id or sticky bits."""
    mode &= 0o777
    if kind == "d":
        return mode | 0o555
    if kind == "f":
        return mode | 0o444 | (0o111 if mode & 0o111 else 0)
    return 0o777


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
                ctx.entries.append(Entry(rel, "d", image_mode("d", st.st_mode)))
        for name in sorted(filenames):
            rel, full = base + name, os.path.join(dirpath, name)
            if excluded(rel, rules):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                ctx.entries.append(Entry(rel, "l", 0o777, 0, os.readlink(full)))
            elif stat.S_ISREG(st.st_mode):
                ctx.entries.append(Entry(rel, "f", image_mode("f", st.st_mode), st.st_size))
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
    """A copy of the context's entries under ``into``, each with its hashed mode: a hard link where
    the file has that mode already and the filesystem allows, else a copy (never a chmod of the
    user's own file)."""
    into.mkdir(parents=True, exist_ok=True)
    folders = {"": 0o755}
    for e in ctx.entries:
        src, dst = ctx.root / e.rel, into / e.rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if e.kind == "d":
            dst.mkdir(exist_ok=True)
            folders[e.rel] = e.mode
        elif e.kind == "l":
            os.symlink(e.digest, dst)
        elif stat.S_IMODE(os.lstat(src).st_mode) != e.mode or not _linked(src, dst):
            shutil.copyfile(src, dst)  # the copy takes the image's mode; the user's file keeps its own
            os.chmod(dst, e.mode)
    # Folders' modes last (a read-only one is filled first), deepest first; a folder made only to
    # hold a path taken back with '!' gets 0755 whatever the umask.
    for dirpath, _, _ in os.walk(into, topdown=False):
        rel = Path(dirpath).relative_to(into).as_posix()
        os.chmod(dirpath, folders.get("" if rel == "." else rel, 0o755))


def _linked(src: Path, dst: Path) -> bool:
    try:
        os.link(src, dst)
    except OSError:
        return False
    return True


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
