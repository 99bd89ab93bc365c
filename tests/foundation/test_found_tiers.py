"""The pure tier (``pytest -m "not real"``) stays pure: no test in it uses a fixture that starts
something real (testkit.REAL_FIXTURES: the Slurm cluster, the API server, podman, torchrun).
tests/conftest.py marks such tests real by their fixtures; this keeps that list and that marking true.
(A pure test that starts a local job fails at its teardown: see ``ddpjob_home`` in tests/conftest.py.)"""

from __future__ import annotations

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
