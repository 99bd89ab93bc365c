"""``watch.run``, the engine's long calls: a process silent and idle past the no-progress limit is
stopped with the message that names the registry; one that keeps printing runs to its end; the
limit comes from $DDPJOB_BUILD_NO_PROGRESS_S and a bad value is a usage error."""

from __future__ import annotations

import time

import pytest

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
