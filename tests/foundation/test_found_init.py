"""``ddpjob init``: the example specs ship inside the package, so a pip-installed ddpjob (no clone,
no jobs/ folder) can start from them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (REPO / "jobs").glob("*.yaml"))


def test_init_writes_the_example_and_never_overwrites(cli, tmp_path: Path) -> None:
    done = cli("init", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "quickstart.yaml"
    assert written.read_text() == (REPO / "jobs" / "quickstart.yaml").read_text()
    assert "ddpjob submit quickstart.yaml --target local --nodes 2 -f" in done.stdout
    assert cli("validate", str(written)).returncode == 0

    written.write_text("name: mine\n")  # the user's edits
    again = cli("init", cwd=tmp_path)
    assert again.returncode == 2 and "quickstart.yaml exists" in again.stderr and "--force" in again.stderr
    assert written.read_text() == "name: mine\n" and "Traceback" not in again.stderr
    assert cli("init", "--force", cwd=tmp_path).returncode == 0
    assert written.read_text() == (REPO / "jobs" / "quickstart.yaml").read_text()


def test_init_lists_prints_and_refuses_unknown_names(cli, tmp_path: Path) -> None:
    listed = cli("init", "--list", cwd=tmp_path)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == sorted(EXAMPLES, key=lambda n: n != "quickstart")
    for name in EXAMPLES:
        printed = cli("init", name, "-o", "-", cwd=tmp_path)
        assert printed.stdout == (REPO / "jobs" / f"{name}.yaml").read_text()
    assert list(tmp_path.iterdir()) == []  # listing and printing write nothing
    unknown = cli("init", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "quickstart" in unknown.stderr
    unwritable = cli("init", "-o", str(tmp_path / "no" / "such" / "dir.yaml"), cwd=tmp_path)
    assert unwritable.returncode == 3 and "cannot write" in unwritable.stderr and "Traceback" not in unwritable.stderr


def test_a_missing_example_path_says_how_to_get_it(cli, tmp_path: Path) -> None:
    """``jobs/quickstart.yaml`` from the README, run where there is no clone."""
    proc = cli("submit", "jobs/quickstart.yaml", "--target", "local", cwd=tmp_path)
    assert proc.returncode == 2 and "file not found" in proc.stderr
    assert "ddpjob init quickstart" in proc.stderr
    other = cli("submit", "jobs/mine.yaml", "--target", "local", cwd=tmp_path)
    assert other.returncode == 2 and "ddpjob init" not in other.stderr


@pytest.mark.real  # slow: builds the wheel with pip
def test_the_wheel_carries_every_example(tmp_path: Path) -> None:
    """What pip installs (not the checkout): build the wheel from the project's files alone (no
    egg-info or build folder left by an earlier install, which would lend it files) and look inside."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for rel in filter(None, listed):
        path = REPO / rel
        if path.is_file() and not path.is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("ddpjob-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"launcher/examples/{n}.yaml" for n in EXAMPLES} <= names
    assert "launcher/spec/examples.py" in names
    assert EXAMPLES and "quickstart" in EXAMPLES
