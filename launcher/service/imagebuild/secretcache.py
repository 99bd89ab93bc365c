"""The files the content scan found clean, remembered by what they hold, so a rebuild scans only the
files that changed (``context.scan`` hashes every file anyway).

A file's scan is skipped only when its sha256, the rules its name gets (``secretscan.rules_key``)
and the scan's version all match a remembered clean scan. The version is a hash of the scan's own
source (``secretscan``, ``secretanchors``, ``spec/secrets`` and the modules it takes names from),
the way its anchors are found and Python's version, so any change to a rule scans everything again.
Only clean files are remembered: a file with a finding, accepted or not, is scanned on every build.
Kept in ``$DDPJOB_HOME/build/scanned-clean``, one line a file, at most ``MAX_ENTRIES`` (then started
again from the files of the build at hand); a cache that cannot be read or written is no cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

from launcher.service.imagebuild import secretanchors, secretscan

FORMAT = "ddpjob-scan-clean 1"
MAX_ENTRIES = 100_000  # ~6.5 MB, read in a few tens of ms
_LINE = 1 + 64  # rules_key, then the sha256 in hex


@functools.lru_cache(maxsize=1)
def version() -> str:
    """The scan's version: the source of its rules' modules (with what ``spec/secrets`` takes from
    the rest of ddpjob), how anchors are found, and Python's (whose ``re`` runs them)."""
    from launcher.spec import secrets

    names = {secretscan.__name__, secretanchors.__name__, secrets.__name__} | {
        m for v in vars(secrets).values()
        if isinstance(m := getattr(v, "__module__", None), str) and m.startswith("launcher.")}
    h = hashlib.sha256(f"{sys.version} {secretanchors.matcher()}".encode())
    for name in sorted(names):
        try:
            h.update(name.encode() + b"\0" + Path(str(sys.modules[name].__file__)).read_bytes())
        except OSError:  # no source to read: a version of this process alone, so nothing is skipped
            h.update(os.urandom(16))
    return h.hexdigest()[:32]


def default_path() -> Path:
    from launcher.core.home import ddpjob_home

    return ddpjob_home() / "build" / "scanned-clean"


class CleanCache:
    """``clean(digest, rules)``: whether this content was scanned clean under these rules before;
    ``add`` what a scan found clean, ``save`` once at the end."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.known: set[str] = set()
        self.new: list[str] = []
        self.used: set[str] = set()  # the remembered ones this build met
        self.current = False  # whether the file on disk is of this version
        if path is None:
            return
        try:
            lines = path.read_text(encoding="ascii").split("\n")
        except (OSError, UnicodeDecodeError):
            return
        if lines and lines[0] == f"{FORMAT} {version()}":
            self.current = True
            self.known = {line for line in lines[1:] if len(line) == _LINE}

    def clean(self, digest: str, rules: str) -> bool:
        """``rules``: the file's ``secretscan.rules_key``."""
        key = rules + digest
        if key in self.known:
            self.used.add(key)
            return True
        return False

    def add(self, digest: str, rules: str) -> None:
        key = rules + digest
        if len(key) == _LINE and key not in self.known:
            self.known.add(key)
            self.new.append(key)

    def save(self) -> None:
        """Append this build's new clean files (whole lines, one write); start the file again when it
        is of another version or over ``MAX_ENTRIES``."""
        if self.path is None or not self.new:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.current and len(self.known) <= MAX_ENTRIES:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, "".join(k + "\n" for k in self.new).encode("ascii"))
                finally:
                    os.close(fd)
            else:
                keep = sorted(self.used.union(self.new) if len(self.known) > MAX_ENTRIES else self.known)
                tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(f"{FORMAT} {version()}\n" + "".join(k + "\n" for k in keep), encoding="ascii")
                os.replace(tmp, self.path)
                self.current = True
        except OSError:
            return
        self.new = []
