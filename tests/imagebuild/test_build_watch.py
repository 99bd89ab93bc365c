"""``watch.run``, the engine's long calls: a process silent and idle past the no-progress limit is
stopped with the message that names the registry; one that keeps printing runs to its end; the
limit comes from $DDPJOB_BUILD_NO_PROGRESS_S and a bad value is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import wait_for

from launcher.core.errors import UsageError
from launcher.service.imagebuild import watch


@pytest.fixture
def fast_poll(monkeypatch):
    """``run`` looks every 0.5 s; the tests' limits are shorter than a second, so it looks more often."""
    monkeypatch.setattr(watch, "POLL_S", 0.05)


def test_a_silent_idle_process_is_stopped_after_the_limit(fast_poll):
    start = time.monotonic()
    with pytest.raises(watch.Stalled) as e:
        watch.run(["sh", "-c", "echo begun; sleep 30"], timeout=60, no_progress=0.3,
                  stalled="the push of r/x:1 to the registry r")
    assert time.monotonic() - start < 15
    assert str(e.value).startswith("the push of r/x:1 to the registry r made no progress for 0.3 s and was stopped")
    assert "DDPJOB_BUILD_NO_PROGRESS_S" in str(e.value)


def test_output_is_progress_and_the_result_is_kept(fast_poll):
    # 0.9 s in all, each line within 0.15 s: longer than the limit, with no silence as long as it
    done = watch.run(["sh", "-c", "for i in 1 2 3 4 5 6; do echo step $i; sleep 0.15; done; printf '\\377\\n' >&2"],
                     timeout=60, no_progress=0.6, stalled="x")
    assert done.returncode == 0 and done.stdout.split()[-1] == "6" and done.stderr == "\ufffd\n"


def test_the_limit_from_the_environment(monkeypatch):
    monkeypatch.delenv(watch.NO_PROGRESS_ENV, raising=False)
    assert watch.no_progress_limit() == watch.DEFAULT_NO_PROGRESS_S
    monkeypatch.setenv(watch.NO_PROGRESS_ENV, "2.5")
    assert watch.no_progress_limit() == 2.5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(watch.NO_PROGRESS_ENV, bad)
        with pytest.raises(UsageError, match="is not a number of seconds"):
            watch.no_progress_limit()


# ---------------------------------------------------------------------- a stopped build's leftovers
FAKE_ENGINE = """#!/bin/sh
# podman ps -a --external ...: the containers listed in $DIR/listed; podman rm -f ID: noted in $DIR/removed
case "$1" in
  ps) /bin/cat "${0%/*}/listed" ;;
  rm) echo "$3" >> "${0%/*}/removed" ;;
esac
"""


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A ``podman`` that lists the containers written to ``listed`` and notes what it is told to
    remove; PATH holds nothing else, so no real runc or crun container is looked at."""
    (tmp_path / "podman").write_text(FAKE_ENGINE)
    (tmp_path / "podman").chmod(0o755)
    (tmp_path / "listed").write_text("old1 storage\nmine2 running\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


def test_a_stopped_build_removes_the_working_containers_that_appeared_while_it_ran(fake_engine, monkeypatch):
    before = watch.leftovers("podman")
    assert before == {"ctr:old1"}  # a container the user runs is not a build's
    (fake_engine / "listed").write_text("old1 storage\nmine2 running\nnew3 storage\n")
    monkeypatch.setattr(watch, "other_builds", lambda engine: [])
    watch.clean("podman", before)
    assert (fake_engine / "removed").read_text().split() == ["new3"]


def test_while_another_build_runs_a_stopped_build_removes_nothing_and_names_what_it_left(fake_engine, monkeypatch,
                                                                                        capsys):
    before = watch.leftovers("podman")
    (fake_engine / "listed").write_text("old1 storage\nnew3 storage\nnew4 storage\n")
    monkeypatch.setattr(watch, "other_builds", lambda engine: [4242])
    watch.clean("podman", before)
    assert not (fake_engine / "removed").exists()
    err = capsys.readouterr().err
    assert err.startswith("another image build is running on this machine (pid 4242), so the 2 container(s)")
    assert "  podman rm -f new3\n  podman rm -f new4" in err and "old1" not in err
    assert "runc delete -f buildah-buildah7 && rm -rf /var/tmp/buildah7" in watch.left_note(
        "podman", ["runc:buildah-buildah7:/var/tmp/buildah7"], [1])


def test_another_build_is_found_by_its_command_line(tmp_path):
    # processes whose argv[0] is podman or buildah (python running under that name, sleeping)
    nap = "import time; time.sleep(60)"
    procs = {argv: subprocess.Popen([*argv[:1], "-c", nap, *argv[1:]], executable=sys.executable)
             for argv in (("podman", "--runtime", "runc", "build"), ("buildah", "from"), ("podman", "run"))}
    try:
        wait_for(lambda: all(Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(argv[0].encode())
                             for argv, p in procs.items()), "the processes to run under their names", timeout=10, poll=0.05)
        found = watch.other_builds("podman")
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert procs[("podman", "--runtime", "runc", "build")].pid in found
    assert procs[("buildah", "from")].pid in found
    assert procs[("podman", "run")].pid not in found
    assert os.getpid() not in found


def test_without_a_proc_to_read_no_other_build_is_found(monkeypatch):
    listdir = os.listdir

    def no_proc(path):
        if path == "/proc":
            raise FileNotFoundError(path)
        return listdir(path)

    with monkeypatch.context() as m:
        m.setattr(watch.os, "listdir", no_proc)
        found = watch.other_builds("podman")
    assert found == []
