"""The pure tier (``pytest -m "not real"``) stays pure: no test in it uses a fixture that starts
something real (testkit.REAL_FIXTURES: the Slurm cluster, the API server, podman, torchrun).
tests/conftest.py marks such tests real by their fixtures; this keeps that list and that marking true.
(A pure test that starts a local job fails at its teardown: see ``ddpjob_home`` in tests/conftest.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from testkit import REAL_FIXTURES, REAL_MARKERS

TESTS = Path(__file__).resolve().parents[1]


def test_every_fixture_known_to_start_real_things_still_exists():
    """A renamed fixture would let its tests into the pure tier unmarked."""
    conftests = {p: p.read_text() for p in TESTS.rglob("conftest.py")}
    for name, what in REAL_FIXTURES.items():
        assert any(f"def {name}(" in text for text in conftests.values()), \
            f"testkit.REAL_FIXTURES names {name} ({what}), which no conftest.py defines any more"


def test_no_selected_test_uses_a_real_fixture_without_the_real_mark(request: pytest.FixtureRequest):
    """Over this session's tests (under -m "not real": the pure tier), a fixture that starts real things,
    directly or through another fixture, comes with the real mark."""
    unmarked = [
        (item.nodeid, sorted(REAL_FIXTURES.keys() & set(getattr(item, "fixturenames", ()))))
        for item in request.session.items
        if (REAL_FIXTURES.keys() & set(getattr(item, "fixturenames", ()))
            or any(item.get_closest_marker(m) for m in REAL_MARKERS))
        and item.get_closest_marker("real") is None
    ]
    assert unmarked == [], f"tests that start real things but are not marked real: {unmarked}"
    if request.config.getoption("markexpr") == "not real":
        assert all(item.get_closest_marker("real") is None for item in request.session.items)


def test_the_in_process_cli_answers_as_the_process_does(tmp_path):
    """The pure tier's ``cli`` runs ``ddpjob`` in the test's process (tests/conftest.py): for a spec
    error, a plan, --help and an error under --debug, it gives the exit code and
    the two streams a real ``ddpjob`` process gives, and leaves the process as it found it."""
    import os
    import signal

    from testkit import ddpjob, ddpjob_in_process

    def shown(err: str) -> str:  # a traceback's frames differ (the runner's own); its header and error do not
        lines = err.splitlines()
        return f"{lines[0]}...{lines[-1]}" if lines and lines[0].startswith("Traceback (most recent") else err

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ncommand: [python, t.py]\nnodes: 0\n")
    good = tmp_path / "g.yaml"
    good.write_text("name: g\ncommand: [python, -c, 'print(1)']\n")
    umask, sigint = os.umask(0o022), signal.getsignal(signal.SIGINT)
    os.umask(umask)
    for args in (["validate", str(spec)], ["render", str(good), "--target", "slurm"], ["logs", "--help"],
                 ["--debug", "status", "x"]):
        here, there = ddpjob_in_process(*args, cwd=tmp_path), ddpjob(*args, cwd=tmp_path)
        assert (here.returncode, here.stdout, shown(here.stderr)) == (there.returncode, there.stdout,
                                                                     shown(there.stderr)), args
    assert "Traceback (most recent call last):" in here.stderr  # --debug: the error's traceback
    assert (os.umask(umask), signal.getsignal(signal.SIGINT)) == (umask, sigint)


def test_hypothesis_writes_nothing_into_the_checkout():
    """No example database, and its other files (a cache of constants) outside the checkout."""
    from hypothesis import settings
    from hypothesis.configuration import storage_directory

    assert settings.default.database is None
    assert not storage_directory("constants", intent_to_write=False).path.resolve().is_relative_to(TESTS.parent)


def test_the_pure_tier_does_not_import_modules_marked_real_as_a_whole(request: pytest.FixtureRequest):
    """tests/conftest.py skips importing them under -m "not real" (torch took ~3 s of collection),
    and only them, and only then."""
    root_conftest = request.config.pluginmanager.get_plugin(str(TESTS / "conftest.py"))
    pytest_ignore_collect = root_conftest.pytest_ignore_collect

    def config(markexpr: str) -> pytest.Config:
        return type("Config", (), {"getoption": staticmethod(lambda name: markexpr)})()  # type: ignore[return-value]

    train = TESTS / "train"
    assert pytest_ignore_collect(train / "test_train_unit.py", config("not real")) is True
    assert pytest_ignore_collect(TESTS / "slurm" / "test_slurm_target.py", config("not real")) is True
    assert pytest_ignore_collect(train / "test_train_config.py", config("not real")) is None  # it has pure tests
    assert pytest_ignore_collect(train / "test_train_unit.py", config("")) is None



def _configured(request: pytest.FixtureRequest, markexpr: str) -> None:
    """tests/conftest.py's ``pytest_configure`` run again, as for ``pytest -m MARKEXPR``."""
    root_conftest = request.config.pluginmanager.get_plugin(str(TESTS / "conftest.py"))
    root_conftest.pytest_configure(type("Config", (), {"getoption": staticmethod(lambda name: markexpr)})())


def test_the_pure_tier_keeps_compiled_test_modules_outside_the_checkout(request: pytest.FixtureRequest, monkeypatch):
    """pytest rewrites a test module's asserts when it imports it and keeps the result only where Python
    may write bytecode: under -m "not real" tests/conftest.py lets it, into a folder outside the checkout
    (under PYTHONDONTWRITEBYTECODE=1 every run rewrote every module again: ~2.5 s of collection); other
    runs are left as they were. The processes started after it (xdist's workers, the commands the tests
    run) keep theirs in the same folder."""
    import os
    import subprocess
    import sys

    from _pytest.assertion.rewrite import PYC_TAIL, get_cache_dir

    if request.config.getoption("markexpr") == "not real":  # this very run: this module's compiled code is kept
        here = Path(__file__)
        assert (get_cache_dir(here) / (here.name[:-3] + PYC_TAIL)).is_file()
    for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "DDPJOB_FUZZ_EXAMPLES"):  # put back (or
        monkeypatch.setenv(name, os.environ.get(name, ""))  # removed) afterwards: the hook sets them
    for markexpr in ("not real", "", "real"):
        monkeypatch.setattr(sys, "pycache_prefix", None)
        monkeypatch.setattr(sys, "dont_write_bytecode", True)
        monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
        monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
        _configured(request, markexpr)
        if markexpr == "not real":
            assert sys.pycache_prefix and not Path(sys.pycache_prefix).resolve().is_relative_to(TESTS.parent)
            assert sys.dont_write_bytecode is False
            assert os.environ.get("PYTHONPYCACHEPREFIX") == sys.pycache_prefix
            assert "PYTHONDONTWRITEBYTECODE" not in os.environ
            code = "import sys; print(sys.pycache_prefix, sys.dont_write_bytecode)"  # what a started process gets
            started = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            assert started.stdout.split() == [sys.pycache_prefix, "False"]
        else:
            assert (sys.pycache_prefix, sys.dont_write_bytecode) == (None, True)
            assert "PYTHONPYCACHEPREFIX" not in os.environ and os.environ["PYTHONDONTWRITEBYTECODE"] == "1"


def test_the_pure_tier_fuzzes_with_a_third_of_the_examples(request: pytest.FixtureRequest, monkeypatch):
    """Under -m "not real" tests/conftest.py sets $DDPJOB_FUZZ_EXAMPLES to 40 (the fuzz's own default is
    120, which the full suite runs), unless the user set it."""
    import os
    import sys

    monkeypatch.setattr(sys, "pycache_prefix", sys.pycache_prefix)  # put back afterwards: the hook sets them
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.setenv("DDPJOB_FUZZ_EXAMPLES", "")  # so that its value (or its absence) is put back too
    for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"):
        monkeypatch.setenv(name, os.environ.get(name, ""))

    def configured(markexpr: str, before: str | None) -> str | None:
        if before is None:
            monkeypatch.delenv("DDPJOB_FUZZ_EXAMPLES", raising=False)
        else:
            monkeypatch.setenv("DDPJOB_FUZZ_EXAMPLES", before)
        _configured(request, markexpr)
        return os.environ.get("DDPJOB_FUZZ_EXAMPLES")

    assert configured("not real", None) == "40"
    assert configured("not real", "500") == "500"
    assert configured("", None) is None
    assert configured("real", None) is None


def test_auto_starts_two_workers_more_than_the_cores_in_the_pure_tier_only(request: pytest.FixtureRequest,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """``-n auto`` (pytest-xdist) asks tests/conftest.py how many workers: the pure tier waits on real
    heartbeats' timeouts for a fifth of its time, so it gets two more than xdist's own count of the
    cores; any other run, which loads the CPU, or a count the user set, xdist's own."""
    from xdist.plugin import pytest_xdist_auto_num_workers as cores

    # That conftest as pytest loaded it (``import conftest`` gives whichever directory's conftest.py
    # was imported last under that name).
    conftest = next(p for p in request.config.pluginmanager.get_plugins()
                    if getattr(p, "__file__", None) == str(TESTS / "conftest.py"))

    class Config:
        def __init__(self, markexpr: str) -> None:
            self.markexpr = markexpr
            self.option = argparse.Namespace(numprocesses="auto")

        def getoption(self, name: str) -> str:
            assert name == "markexpr"
            return self.markexpr

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert conftest.pytest_xdist_auto_num_workers(Config("not real")) == cores(Config("not real")) + 2
    assert conftest.pytest_xdist_auto_num_workers(Config("real")) is None
    assert conftest.pytest_xdist_auto_num_workers(Config("")) is None
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert conftest.pytest_xdist_auto_num_workers(Config("not real")) is None


@pytest.mark.real  # starts pytest on two workers (~5 s)
@pytest.mark.parametrize("unit, files", [
    ("tests/slurm/", ["tests/slurm/test_slurm_end_allocation.py", "tests/slurm/test_slurm_render.py"]),
    ("tests/imagebuild/", ["tests/imagebuild/test_build_context.py", "tests/imagebuild/test_build_secrets.py"])])
def test_loadgroup_keeps_tests_that_share_a_thing_on_one_worker_and_runs_the_rest_beside(tmp_path, unit, files):
    """The README's full run (``-n 2 --dist loadgroup``) hands every test under tests/slurm/ to one
    worker (they share one cluster), and every one under tests/imagebuild/ (they share podman's build
    storage), and runs the others on the other worker beside them. Run on a few pure tests of each kind."""
    import subprocess
    import sys

    others = ["tests/foundation/test_found_config.py", "tests/foundation/test_found_spec.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-m", "not real",
                           "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}", *files, *others],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = [line.split(" PASSED ") for line in proc.stdout.splitlines() if line.startswith("[gw") and " PASSED " in line]
    where = [(head.split()[0], test) for head, test in ran]
    assert sum(test.startswith(unit) for _, test in where) > 10, proc.stdout[-3000:]
    workers = {w for w, test in where if test.startswith(unit)}
    assert len(workers) == 1, where
    assert {w for w, test in where if not test.startswith(unit)} - workers, where  # the rest ran beside them
