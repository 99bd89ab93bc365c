"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Shared test helpers (tests/goldens.py) import by name from any test directory.
sys.path.insert(0, str(Path(__file__).parent))

from testkit import (  # noqa: E402
    REAL_FIXTURES,
    REAL_MARKERS,
    TESTS_HOME,
    ddpjob,
    ddpjob_in_process,
    stop_leftovers,
)

HYPOTHESIS_HOME = TESTS_HOME / "hypothesis"
TESTS_HOME.mkdir(mode=0o700, exist_ok=True)


def _set_up_hypothesis() -> None:
    """Hypothesis keeps no example database (a failure is reproduced from the seed and the example it
    prints), and the cache of constants it writes whatever the database goes to a folder of this user
    outside the checkout (by default both are ./.hypothesis/). Set before any test module is imported
    (from pytest_configure): a test's @given reads the code's constants when it is collected. Imported
    there, after the pure tier has set where bytecode goes (1. below): pytest rewrites the asserts of
    a plugin's whole package, hypothesis's 84 modules (~1 s), and keeps them only where bytecode may be
    written. Hypothesis loads every installed "hypothesis" entry point when it is imported: trio's (a
    selenium dependency here) imports trio.testing and pytest's internals, ~0.3 s a process, and no
    test uses it; HYPOTHESIS_NO_PLUGINS=1, unless set, skips them."""
    os.environ.setdefault("HYPOTHESIS_NO_PLUGINS", "1")
    from hypothesis import settings
    from hypothesis.configuration import set_hypothesis_home_dir

    settings.register_profile("ddpjob", database=None)
    settings.load_profile("ddpjob")
    set_hypothesis_home_dir(HYPOTHESIS_HOME)


# A module marked real as a whole (``pytestmark = pytest.mark.real``, or slurm, which is real too).
WHOLE_MODULE_REAL = re.compile(r"^pytestmark = .*\bpytest\.mark\.(real|slurm)\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the pure tier (``-m "not real"``) a test module marked real as a whole is not even imported:
    none of its tests could be selected, and importing it costs (torch alone took ~3 s of collection)."""
    if (config.getoption("markexpr") == "not real" and collection_path.name.startswith("test_")
            and collection_path.suffix == ".py" and WHOLE_MODULE_REAL.search(collection_path.read_text())):
        return True
    return None


# The pure tier (-m "not real") is the loop run after every edit; two things make it cheaper:
# 1. Its compiled code is kept, outside the checkout. pytest rewrites every test module's asserts when
#    it imports it and keeps the result only where Python may write bytecode: under
#    PYTHONDONTWRITEBYTECODE=1 (or -B) it rewrote all of them at each run (~2.5 s of ~4 s of
#    collection). So the process writes bytecode, of the test modules, launcher and the libraries it
#    imports alike, into PYCACHE (a folder of this user, keyed by each file's full path), never into a
#    __pycache__/ of the checkout. The processes it starts from then on do the same (through
#    PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE unset): xdist's workers, whose start-up imports come
#    before their pytest_configure (one worker's start-up went from ~2.5 s of CPU to ~0.8 s), and the
#    ddpjob commands the tests run (launcher, editable, has no bytecode of its own: each compiled what
#    it imported). Only the pure tier: the first run on a machine compiles every library it imports
#    into that folder once (~1 s here; torch, kubernetes and the rest in a full run, which CI makes once
#    on a fresh machine, where it would cost and never pay).
# 2. It fuzzes the front door (tests/foundation/test_found_fuzz.py) with a third of the examples the
#    full suite runs: ~2.5 s rather than ~7 s. $DDPJOB_FUZZ_EXAMPLES, when set, counts for both.
PYCACHE = TESTS_HOME / "pycache"
FUZZ_EXAMPLES_PURE = 40


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("markexpr") == "not real":
        sys.pycache_prefix = str(PYCACHE)
        sys.dont_write_bytecode = False
        os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ.setdefault("DDPJOB_FUZZ_EXAMPLES", str(FUZZ_EXAMPLES_PURE))
    _set_up_hypothesis()


# 3. `-n auto` starts two workers more than xdist's own count (the cores). A fifth of the pure tier's
#    time is waiting, not computing: real heartbeats on loopback wait out their timeouts (tests/
#    foundation/test_found_lost_node.py and its neighbours), a hung nvidia-smi its limit. A worker that
#    waits leaves its core to the extra ones. On the 2-core machine here, alternating in one session: 4
#    workers 34-41 s wall (median 37.5), 2 workers 41-45 s (median 41.8); 6 were no better than 4 (each
#    worker collects the suite again). Other runs (the full suite, -m real) keep xdist's count: their
#    tests load the CPU; so does a count set in $PYTEST_XDIST_AUTO_NUM_WORKERS.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if config.getoption("markexpr") != "not real" or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from xdist.plugin import pytest_xdist_auto_num_workers as cores

    return cores(config) + 2


# 4. The full suite runs on two workers (README: pytest -n 2 --dist loadgroup), the Slurm tests on one
#    beside the rest: serially they were ~19 of the suite's ~53 minutes, with the cores ~57% idle while
#    they wait on the private cluster (SlurmdTimeout, requeues, a node declared down). They share one
#    cluster, which the worker that runs them starts and stops, so they go as one unit: this scheduler
#    is xdist's loadscope with one scope for everything under tests/slurm/ and one per test elsewhere.
#    The largest scope is handed out first, so one worker starts on the Slurm tests at once and takes
#    single tests again when they are done. (xdist's own loadgroup groups by an xdist_group mark it
#    writes into each test's id on the worker; under pytest 9.2 that no longer reaches the scheduler,
#    pytest-dev/pytest-xdist#1386, so the tests were split. Here the scope is read from the test's path.)
#    The image build tests are one unit too: they share podman's build storage, and the Ctrl-C tests
#    count the build containers that appear while their build runs; a stopped build removes them only
#    when no other build runs (service/imagebuild/watch.py), so another test's build beside it would
#    change what they check.
TOGETHER = ("tests/slurm/", "tests/imagebuild/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedThingsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((unit for unit in TOGETHER if nodeid.startswith(unit)), nodeid)

    return SharedThingsTogether(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m "not real" deselects: it must see these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a fixture which starts something real (testkit.REAL_FIXTURES), or carry a marker
    that needs one, are in the real tier, wherever they live."""
    for item in items:
        if REAL_FIXTURES.keys() & set(getattr(item, "fixturenames", ())) or any(
                item.get_closest_marker(m) for m in REAL_MARKERS):
            item.add_marker(pytest.mark.real)


@pytest.fixture(autouse=True)
def ddpjob_home(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own registry, so nothing touches the user's ~/.ddpjob, and reads no
    defaults file. Afterwards, any
    process the test left running (found by this home in its environment: supervisors, torchrun
    agents, workers) is stopped, so a failed test cannot leave sleepers behind. A test of the pure
    tier (not marked real) that started a local job is an error: it belongs to the real tier."""
    home = tmp_path_factory.mktemp("ddpjob-home")
    monkeypatch.setenv("DDPJOB_HOME", str(home))
    # Nor the user's defaults: no ~/.config/ddpjob/config.yaml or .ddpjob.yaml above the test's
    # folder changes what a test submits (tests of those files set DDPJOB_CONFIG themselves).
    monkeypatch.setenv("DDPJOB_CONFIG", "none")
    yield home
    left, survivors = stop_leftovers(home)
    if left:
        warnings.warn(f"stopped processes {left} this test left running"
                      + (f"; {survivors} survived SIGKILL" if survivors else ""), stacklevel=1)
    started = sorted(p.parent.name for p in home.glob("runs/*/supervisor.log"))
    if started and request.node.get_closest_marker("real") is None:
        pytest.fail(f"this test started local job(s) {started} but is not marked real: add "
                    "@pytest.mark.real (the pure tier, pytest -m 'not real', starts no job)", pytrace=False)


@pytest.fixture
def cli(request: pytest.FixtureRequest):
    """``cli("submit", ...)`` runs the real command line and returns the result as a finished process.

    In the real tier in a subprocess (what users run); in the pure tier in this process through
    click's test runner (``ddpjob_in_process``): the same ``main``, its exit codes and both streams,
    without starting Python and loading the CLI again for every call. A pure test whose subject is
    the process itself (start-up imports, signals, a real exit) uses ``cli_process``."""
    return ddpjob if request.node.get_closest_marker("real") else ddpjob_in_process


@pytest.fixture
def cli_process():
    """``cli_process("submit", ...)``: the command line in a subprocess, in any tier."""
    return ddpjob
