"""Pruning the OCI bundles under ``<folder>/oci`` (launcher.targets.slurm.bundles) on real
directories with hard-linked files, as prepare_bundle makes them. Which bundles jobs in the queue
use is given here; tests/slurm/test_slurm_containers.py reads it from the real cluster's squeue."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from launcher.targets.slurm import bundles

DAY = 86400.0


def _oci(tmp_path: Path) -> Path:
    """An image's files (1 MiB) and three bundles of it (hard links), as submit leaves them."""
    oci = tmp_path / "oci"
    base = oci / "aaaaaaaaaaaa"
    (base / "rootfs" / "bin").mkdir(parents=True)
    (base / "rootfs" / "bin" / "python3").write_bytes(os.urandom(2**20))
    for digest in ("111111111111", "222222222222", "333333333333"):
        bundle = oci / f"aaaaaaaaaaaa-{digest}"
        bundle.mkdir()
        subprocess.run(["cp", "-al", str(base / "rootfs"), str(bundle / "rootfs")], check=True)
        (bundle / "config.json").write_text("{}")
        bundles.stamp(str(bundle))
    bundles.stamp(str(base))
    return oci


def _age(path: Path, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(path / bundles.STAMP, (t, t))


def test_unused_old_bundles_go_and_used_or_recent_ones_stay(tmp_path):
    oci = _oci(tmp_path)
    old, busy, recent = (oci / f"aaaaaaaaaaaa-{d}" for d in ("111111111111", "222222222222", "333333333333"))
    _age(old, 8)
    _age(busy, 30)  # old, but a job in the queue runs it
    _age(oci / "aaaaaaaaaaaa", 8)
    count, size = bundles.usage(str(oci))
    assert count == 3 and 2**20 <= size < 2**20 + 2**19  # the image's files counted once, not 4 times
    done = bundles.prune(str(oci), used={str(busy)})
    assert done.removed == [str(old)] and done.kept_in_use == [str(busy)]
    assert busy.is_dir() and recent.is_dir() and (oci / "aaaaaaaaaaaa" / "rootfs" / "bin" / "python3").is_file()
    # Nothing uses the image any more and its last bundles are old: all of it goes.
    _age(recent, 8)
    done = bundles.prune(str(oci), used=set())
    assert sorted(done.removed) == sorted([str(busy), str(recent), str(oci / "aaaaaaaaaaaa")])
    assert os.listdir(oci) == [bundles.USAGE_CACHE] and bundles.usage(str(oci)) == (0, 0)


def test_nothing_goes_when_the_queue_cannot_be_read(tmp_path, monkeypatch):
    oci = _oci(tmp_path)
    for d in oci.iterdir():
        _age(d, 30)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no squeue: which bundles jobs use is unknown
    done = bundles.prune(str(oci))
    assert done.removed == [] and "squeue" in done.why_none
    assert len(os.listdir(oci)) == 4


def test_a_short_keep_and_interrupted_submits(tmp_path):
    oci = _oci(tmp_path)
    tmp = oci / "aaaaaaaaaaaa-444444444444.tmp-123"
    tmp.mkdir()
    t = time.time() - 2 * DAY
    os.utime(tmp, (t, t))
    done = bundles.prune(str(oci), keep_s=0, now=time.time() + 1, used=set())
    assert len(done.removed) == 4 and os.listdir(oci) == []


def test_what_each_takes_is_walked_once_and_again_for_a_new_bundle(tmp_path, monkeypatch):
    oci = _oci(tmp_path)
    first = bundles.usage(str(oci))
    walked = []
    real = bundles._own_bytes
    monkeypatch.setattr(bundles, "_own_bytes", lambda path, **kw: walked.append(path) or real(path, **kw))
    assert bundles.usage(str(oci)) == first and walked == []  # kept in .usage.json: no walk of the image
    bundle = oci / "aaaaaaaaaaaa-111111111111"
    subprocess.run(["rm", "-rf", str(bundle)], check=True)
    time.sleep(0.05)  # past the file system's clock tick
    bundle.mkdir()  # made again (another change time, if not another inode): walked again
    (bundle / "config.json").write_bytes(os.urandom(2**19))
    count, size = bundles.usage(str(oci))
    assert walked == [str(bundle)] and count == 3 and size >= first[1] + 2**19 - 2**16
