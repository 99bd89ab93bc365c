"""A build context: the folder's entries after the ignore file (``ignores``) and the secret-looking
defaults (``secretfiles``), what was left out and why, their content hash, and a staged copy that
holds exactly those entries for the engine.

The engine is given the staged copy (hard links where possible), so what is hashed is exactly what
is built, whichever ignore file was used and whichever engine builds. The modes hashed are the
modes staged: every file and folder readable by any user of the image (its files belong to root
there), executable where the owner's copy is, and without set-id bits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.service.imagebuild import secretcache, secretfiles, secretscan
from launcher.service.imagebuild.ignores import Rule, excluded, prefixes, rules_of

HASH_FORMAT = "ddpjob-build-2"  # 2: modes as staged, secret-looking files left out


@dataclass
class Entry:
    rel: str
    kind: str  # "f" file, "d" folder, "l" symbolic link
    mode: int  # as staged (``image_mode``)
    size: int = 0
    digest: str = ""  # a file's sha256, a link's target


@dataclass(frozen=True)
class LeftOut:
    """A path kept out of the image (a folder stands for everything in it)."""

    rel: str
    kind: str
    why: str
    size: int = 0
    secret: bool = False  # by ddpjob's secret-looking rule or --env-file, not the user's ignore file

    @property
    def shown(self) -> str:
        return self.rel + "/" if self.kind == "d" else self.rel


@dataclass
class Context:
    """The entries of a context, sorted by path, what was left out, and where their rules came from."""

    root: Path
    entries: list[Entry] = field(default_factory=list)
    ignore_file: str | None = None
    left_out: list[LeftOut] = field(default_factory=list)
    # (path, label) for each file holding one of the values ``scan`` was asked to look for.
    holding: list[tuple[str, str]] = field(default_factory=list)
    # What the content scan (``secretscan``) found in the files that go in, and the files it did not
    # read and why (binary, too large); both empty when the contents were not read.
    findings: list[secretscan.Finding] = field(default_factory=list)
    unscanned: list[tuple[str, str]] = field(default_factory=list)
    scanned: bool = False  # whether the contents were read (and scanned, unless asked not to)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def secret_left_out(self) -> list[LeftOut]:
        return [o for o in self.left_out if o.secret]

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


class _Walk:
    """What leaves a path out, and the record of it (paths in a left-out folder are not listed one by one)."""

    def __init__(self, ctx: Context, rules: list[Rule], env_files: set[str]) -> None:
        self.ctx, self.rules, self.env_files = ctx, rules, env_files
        self.ignored = f"ignored by {ctx.ignore_file or 'the default ignores'}"
        self.gone: dict[str, str] = {}  # left-out folders and why

    def why_out(self, rel: str, *, folder: bool) -> tuple[str, bool] | None:
        """(why, secret) when ``rel`` stays out of the image; None when it goes in."""
        if excluded(rel, self.rules):
            return self.ignored, False
        if rel in self.env_files and not secretfiles.taken_back(rel, rel, self.rules):
            return secretfiles.ENV_FILE_WHY, True
        hit = secretfiles.by_name(rel, folder=folder)
        if hit is not None and not secretfiles.taken_back(rel, hit[0], self.rules):
            return f"secret-looking: {hit[1]}", True
        return None

    def leave(self, rel: str, kind: str, why: str, secret: bool, size: int = 0) -> None:
        """Record ``rel`` as left out, unless a folder above it is, for the same reason."""
        if not any(self.gone.get(p) == why for p in prefixes(rel)[:-1]):
            self.ctx.left_out.append(LeftOut(rel, kind, why, size, secret))
        if kind == "d":
            self.gone[rel] = why


def scan(root: Path, *, limit: int | None = None, env_files: Iterable[str] = (),
         needles: Mapping[str, bytes] | None = None, secrets: bool = True,
         cache: secretcache.CleanCache | None = None) -> Context:
    """The context's entries and what was left out. Contents are read (hashed, their first bytes
    checked for a private key, searched for each of ``needles``: label -> value, and scanned for
    secrets by ``secretscan`` unless ``secrets`` is False) only when the total stays within
    ``limit``. ``env_files``: the ``--env-file`` paths given, wherever they are. ``cache``: the
    files scanned clean before (default: the one in ``$DDPJOB_HOME``, ``secretcache``)."""
    rules, ignore_file = rules_of(root)
    prune = not any(r.keep for r in rules)  # without ``!`` lines a left-out folder is not entered
    ctx = Context(root, ignore_file=ignore_file)
    walk = _Walk(ctx, rules, env_rels(root, env_files))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        dirnames.sort()
        for name in list(dirnames):
            rel, full = base + name, os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                dirnames.remove(name)  # a link to a folder is a link, as the engines copy it
                _add_file(walk, rel, full, st)
            elif (out := walk.why_out(rel, folder=True)) is not None:
                walk.leave(rel, "d", *out)
                if prune:
                    dirnames.remove(name)
            else:
                ctx.entries.append(Entry(rel, "d", image_mode("d", st.st_mode)))
        for name in sorted(filenames):
            rel, full = base + name, os.path.join(dirpath, name)
            _add_file(walk, rel, full, os.lstat(full))
    ctx.entries.sort(key=lambda e: e.rel)
    if limit is None or ctx.size <= limit:
        clean = None
        if secrets:
            clean = cache if cache is not None else secretcache.CleanCache(secretcache.default_path())
        _read_contents(walk, needles or {}, secrets, clean)
        if clean is not None:
            clean.save()
    ctx.left_out.sort(key=lambda o: o.rel)
    return ctx


def _add_file(walk: _Walk, rel: str, full: str, st: os.stat_result) -> None:
    link = stat.S_ISLNK(st.st_mode)
    if not link and not stat.S_ISREG(st.st_mode):
        return  # sockets, pipes, devices: no engine copies them
    kind = "l" if link else "f"
    out = walk.why_out(rel, folder=False)
    if out is not None:
        walk.leave(rel, kind, *out, size=0 if link else st.st_size)
    elif link:
        walk.ctx.entries.append(Entry(rel, "l", 0o777, 0, os.readlink(full)))
    else:
        walk.ctx.entries.append(Entry(rel, "f", image_mode("f", st.st_mode), st.st_size))


def _read_contents(walk: _Walk, needles: Mapping[str, bytes], secrets: bool,
                   clean: secretcache.CleanCache | None) -> None:
    ctx, kept = walk.ctx, []
    ctx.scanned = True
    for e in ctx.entries:
        if e.kind == "f":
            seen = secretscan.start(e.rel, e.size) if secrets else None
            e.digest, head, found = _read(ctx.root / e.rel, needles, seen)
            why = secretfiles.by_content(head)
            if why is not None and not secretfiles.taken_back(e.rel, e.rel, walk.rules):
                walk.leave(e.rel, "f", f"secret-looking: {why}", True, e.size)
                continue
            ctx.holding.extend((e.rel, label) for label in sorted(found))
            if seen is not None:
                if seen.skipped:
                    ctx.unscanned.append((e.rel, seen.skipped))
                elif clean is None:
                    ctx.findings += seen.done()
                elif not clean.clean(e.digest, key := seen.key):  # a file scanned clean before is not again
                    findings = seen.done(key)
                    ctx.findings += findings
                    if not findings:
                        clean.add(e.digest, key)
        kept.append(e)
    ctx.entries = kept


def _read(path: Path, needles: Mapping[str, bytes],
          seen: secretscan.FileScan | None = None) -> tuple[str, bytes, set[str]]:
    """A file's sha256, its first bytes, and the labels of the ``needles`` found in it; each piece
    read is handed to ``seen``, the file's content scan."""
    h, head, tail = hashlib.sha256(), b"", b""
    found: set[str] = set()
    overlap = max((len(v) for v in needles.values()), default=1) - 1  # a value across two chunks
    # A file to be scanned is read in one piece (the scan needs it whole, and joining pieces is a copy).
    piece = min(seen.size, secretscan.MAX_SCANNED) + 1 if seen is not None and not seen.skipped else 1 << 20
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(piece), b""):
            h.update(chunk)
            head = head or chunk[:secretfiles.HEAD_BYTES]
            if seen is not None:
                seen.feed(chunk)
            if needles:
                window = tail + chunk
                found.update(label for label, value in needles.items() if value in window)
                tail = window[-overlap:] if overlap else b""
    return h.hexdigest(), head, found


def env_rels(root: Path, paths: Iterable[str]) -> set[str]:
    """The context-relative paths of ``paths`` that lie in ``root`` (``root`` resolved), as named and
    as their links resolve."""
    out = set()
    for path in paths:
        given = os.path.abspath(path)
        for candidate in (Path(os.path.realpath(os.path.dirname(given))) / os.path.basename(given),
                          Path(os.path.realpath(given))):
            if candidate.is_relative_to(root) and candidate != root:
                out.add(candidate.relative_to(root).as_posix())
    return out


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
