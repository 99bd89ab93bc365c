"""The OCI bundles of ``slurm.container.runtime: oci`` under ``<folder>/oci/``: what they take on
disk, and removing the ones nothing uses any more.

``<folder>/oci/<image id>/rootfs`` holds an image's files; each ``<image id>-<config digest>/`` bundle
(one per set of mounts: a working folder, an output folder) hard-links them, so a bundle costs
little beyond its image's files, though ``du`` of one bundle shows them all. Every submit stamps the
bundle it uses (``.last-used``) and then removes, in that folder:

- bundles last used more than ``keep_s`` ago (default 7 days) that no job Slurm still lists uses
  (read from the submission scripts squeue names: a queued or running job keeps its bundle
  whatever its age); where squeue does not answer, nothing is removed;
- an image's files once no bundle of that image is left and they are that old too;
- what an interrupted submit left (``*.tmp-<pid>``) after a day.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field

STAMP = ".last-used"
USAGE_CACHE = ".usage.json"
KEEP_S = 7 * 86400.0
TMP_KEEP_S = 86400.0
_BUNDLE = re.compile(r"^[0-9a-f]{12}-[0-9a-f]{12}$")
_BASE = re.compile(r"^[0-9a-f]{12}$")
_CONTAINER = re.compile(r"--container=(\S+)")


@dataclass
class Pruned:
    removed: list[str] = field(default_factory=list)
    kept_in_use: list[str] = field(default_factory=list)  # old enough, but a job in the queue uses them
    why_none: str = ""  # why nothing could be removed (squeue did not answer)


def stamp(path: str) -> None:
    """Mark ``path`` (a bundle, or an image's files) used now."""
    with open(os.path.join(path, STAMP), "a", encoding="utf-8"):
        pass
    os.utime(os.path.join(path, STAMP))


def last_used(path: str) -> float:
    for p in (os.path.join(path, STAMP), os.path.join(path, "config.json"), path):
        try:
            return os.stat(p).st_mtime
        except OSError:
            continue
    return 0.0


def in_use(timeout: float = 10.0) -> set[str] | None:
    """The bundles named by the submission scripts of the jobs Slurm lists now (queued, running,
    completing); None when squeue does not answer (then nothing is safe to remove)."""
    try:
        proc = subprocess.run(["squeue", "-h", "-o", "%o"], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    used: set[str] = set()
    for script in {line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("/")}:
        try:
            with open(script, encoding="utf-8", errors="replace") as f:
                used.update(m.rstrip("/") for m in _CONTAINER.findall(f.read()))
        except OSError:
            continue  # another user's job, or a script that is gone: not one of these bundles
    return used


def prune(oci_dir: str, *, keep_s: float = KEEP_S, now: float | None = None,
          used: set[str] | None = None) -> Pruned:
    """Remove what nobody uses under ``oci_dir`` (see the module's text). ``used``: the bundles jobs
    in the queue use (asked of squeue when not given)."""
    out = Pruned()
    now = time.time() if now is None else now
    try:
        names = sorted(os.listdir(oci_dir))
    except OSError:
        return out
    for name in names:
        if ".tmp-" in name and now - last_used(os.path.join(oci_dir, name)) > TMP_KEEP_S:
            shutil.rmtree(os.path.join(oci_dir, name), ignore_errors=True)
    old = [n for n in names if _BUNDLE.match(n) and now - last_used(os.path.join(oci_dir, n)) > keep_s]
    if old and used is None:
        used = in_use()
        if used is None:
            out.why_none = "squeue did not answer, so no bundle is known to be unused"
            return out
    for name in old:
        path = os.path.join(oci_dir, name)
        if path in (used or set()):
            out.kept_in_use.append(path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        out.removed.append(path)
    left = {n.split("-", 1)[0] for n in os.listdir(oci_dir) if _BUNDLE.match(n)}
    for name in names:
        path = os.path.join(oci_dir, name)
        if _BASE.match(name) and name not in left and now - last_used(path) > keep_s:
            shutil.rmtree(path, ignore_errors=True)
            out.removed.append(path)
    return out


def usage(oci_dir: str) -> tuple[int, int]:
    """(bundles, bytes on disk) under ``oci_dir``, each file counted once however many links it has.

    An image's files count with the image (``<image id>/``); a bundle counts only what it does not
    share with it (its folders, config.json). Bundles and images are never changed once made, so what
    each takes is kept in ``.usage.json`` (by name, inode and change time): render, which shows this, walks the
    tens of thousands of files of an image once, not at every call."""
    try:
        names = sorted(os.listdir(oci_dir))
    except OSError:
        return 0, 0
    cache_path = os.path.join(oci_dir, USAGE_CACHE)
    try:
        with open(cache_path, encoding="utf-8") as f:
            cache = json.load(f)
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    fresh: dict[str, list[int]] = {}
    total = 0
    for name in names:
        if not (_BUNDLE.match(name) or _BASE.match(name)):
            continue
        path = os.path.join(oci_dir, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        known, key = cache.get(name), [st.st_ino, st.st_ctime_ns]  # a folder made again differs in both
        if isinstance(known, list) and len(known) == 3 and known[:2] == key and isinstance(known[2], int):
            size = known[2]
        else:
            size = _own_bytes(path, shared_only_once=bool(_BUNDLE.match(name)))
        fresh[name] = [*key, size]
        total += size
    if fresh != cache:
        with contextlib.suppress(OSError):
            tmp = f"{cache_path}.tmp-{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(fresh, f)
            os.replace(tmp, cache_path)
    return sum(1 for n in names if _BUNDLE.match(n)), total


def _own_bytes(path: str, *, shared_only_once: bool) -> int:
    """Bytes on disk under ``path``, each inode once; with ``shared_only_once`` (a bundle), files
    with more than one link (its image's files, counted with the image) are left out."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if shared_only_once and not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total
