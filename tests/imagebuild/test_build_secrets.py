"""Nothing secret ships (pure tier: no engine, no registry): every path in the image is readable by
its user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from launcher.service.imagebuild import context as buildctx
from launcher.service.imagebuild import pin


def put(root: Path, rel: str, text: str = "x\n", mode: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        os.chmod(path, mode)
    return path


# ---------------------------------------------------------------------------- modes in the image


def test_the_staged_copy_is_readable_by_the_images_user_and_leaves_the_users_files_alone(tmp_path):
    root = tmp_path / "ctx"
    private = put(root, "train.py", mode=0o600)
    script = put(root, "run.sh", mode=0o700)
    plain = put(root, "pkg/util.py", mode=0o644)
    setid = put(root, "tool", mode=0o4755)
    put(root, "hidden/data.txt", mode=0o600)
    os.chmod(root / "hidden", 0o700)
    ctx = buildctx.scan(root)
    staged = tmp_path / "staged"
    buildctx.stage(ctx, staged)

    def mode(path: Path) -> int:
        return stat.S_IMODE(os.lstat(path).st_mode)

    assert {e.rel: e.mode for e in ctx.entries} == {"train.py": 0o644, "run.sh": 0o755, "pkg": 0o755,
                                                   "pkg/util.py": 0o644, "tool": 0o755, "hidden": 0o755,
                                                   "hidden/data.txt": 0o644}
    for e in ctx.entries:  # what is hashed is what is staged
        assert mode(staged / e.rel) == e.mode, e.rel
    assert mode(staged) == 0o755
    assert (mode(private), mode(script), mode(setid)) == (0o600, 0o700, 0o4755)  # the user's own: untouched
    assert os.stat(staged / "train.py").st_ino != os.stat(private).st_ino  # a copy, not a link, when modes differ
    assert os.stat(staged / "pkg/util.py").st_ino == os.stat(plain).st_ino  # a link when they agree
    assert pin.generated_dockerfile("base:1", "/workspace") == "FROM base:1\nWORKDIR /workspace\nCOPY . /workspace\n"


def test_a_folder_made_for_a_path_taken_back_is_enterable(tmp_path):
    root = tmp_path / "ctx"
    put(root, "data/keep.txt")
    put(root, "data/drop.txt")
    put(root, ".ddpjobignore", "data\n!data/keep.txt\n")
    ctx = buildctx.scan(root)
    old = os.umask(0o077)
    try:
        buildctx.stage(ctx, tmp_path / "staged")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "staged" / "data").st_mode) == 0o755
    assert sorted(p.name for p in (tmp_path / "staged" / "data").iterdir()) == ["keep.txt"]


def test_init_writes_a_spec_anyone_can_read_whatever_the_umask(tmp_path):
    proc = subprocess.run(["sh", "-c", f"umask 077 && exec {sys.executable} -m launcher init -o spec.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "spec.yaml").st_mode) == 0o644
