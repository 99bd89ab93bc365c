"""The registry: ids, two-phase submit, terminal states, concurrent use from many processes."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from launcher.core.errors import JobNotFound
from launcher.core.states import JobState, combine
from launcher.service.registry import Registry

REPO = Path(__file__).resolve().parents[2]


def test_ids_are_readable_and_unique(tmp_path):
    reg = Registry(tmp_path)
    ids = {reg.reserve("train", "local", {})[0] for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"train-[a-z2-9]{5}", i) for i in ids)


def test_two_phase_and_terminal_states_are_final(tmp_path):
    reg = Registry(tmp_path)
    job_id, _ = reg.reserve("a", "local", {"name": "a"})
    rec = reg.get(job_id)
    assert rec.state == JobState.PENDING and rec.handle is None
    reg.record_handle(job_id, {"pid": 1})
    reg.update_state(job_id, JobState.RUNNING)
    reg.update_state(job_id, JobState.CANCELLED, "cancelled by user")
    reg.update_state(job_id, JobState.RUNNING, "late report")
    reg.update_state(job_id, JobState.FAILED, "late failure")
    rec = reg.get(job_id)
    assert rec.state == JobState.CANCELLED and rec.message == "cancelled by user"
    assert rec.ended_at is not None and rec.handle == {"pid": 1}


def test_unknown_id_suggests(tmp_path):
    reg = Registry(tmp_path)
    job_id, _ = reg.reserve("quickstart", "local", {})
    assert reg.get(job_id[:-2]).id == job_id  # a unique prefix is enough
    with pytest.raises(JobNotFound) as info:
        reg.get("quickstrat-" + job_id[-5:])
    assert job_id in str(info.value) and "ddpjob list" in str(info.value)


def test_ports_of_live_jobs_are_not_reused(tmp_path):
    reg = Registry(tmp_path)
    seen = []

    def picker(busy):
        seen.append(set(busy))
        return 20000 + len(busy)

    _, p1 = reg.reserve("a", "local", {}, port_picker=picker)
    j2, p2 = reg.reserve("b", "local", {}, port_picker=picker)
    assert p1 != p2 and seen[1] == {p1}
    reg.update_state(j2, JobState.SUCCEEDED)
    _, p3 = reg.reserve("c", "local", {}, port_picker=picker)
    assert seen[2] == {p1}  # a finished job's port is free again
    assert p3 == p2


def test_wal_mode(tmp_path):
    reg = Registry(tmp_path)
    reg.reserve("a", "local", {})
    with sqlite3.connect(reg.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_concurrent_reserve_from_threads(tmp_path):
    reg = Registry(tmp_path)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: Registry(tmp_path).reserve("t", "local", {},
                                                                       port_picker=lambda busy: max(busy | {19999}) + 1), range(40)))
    assert len({r[0] for r in results}) == 40
    assert len({r[1] for r in results}) == 40  # the port choice is atomic with the insert
    assert len(reg.list()) == 40


def _first_use(home: str, start, results) -> None:
    start.wait()  # every process opens the new registry at the same moment
    try:
        Registry(Path(home)).reserve("first", "local", {})
        results.put("ok")
    except Exception as e:
        results.put(f"{type(e).__name__}: {e}")


@pytest.mark.real  # slow: 30 x 6 forked processes
def test_processes_that_first_use_a_new_home_at_once_all_succeed(tmp_path):
    """Setting the database up (WAL mode, tables) is serialized: without it, SQLite answered about
    one trial in eight with "database is locked" at once (seen as a failed submit of two at once)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for trial in range(30):
        home = tmp_path / f"home{trial}"
        start, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_first_use, args=(str(home), start, results)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = [results.get(timeout=10) for _ in procs]
        assert outcomes == ["ok"] * 6, (trial, outcomes)
        assert len(Registry(home).list()) == 6


def test_a_released_reservation_leaves_no_trace(tmp_path):
    reg = Registry(tmp_path)
    job_id, _ = reg.reserve("a", "local", {})
    kept, _ = reg.reserve("b", "local", {})
    reg.record_handle(kept, {"pid": 1})
    reg.release(job_id)
    reg.release(kept)  # a job with a handle was submitted: it is never released
    assert [r.id for r in reg.list()] == [kept]


@pytest.mark.real
def test_twenty_concurrent_cli_calls_never_corrupt(tmp_path, ddpjob_home):
    """Writers and readers at once: local submits (reserve a port, record a handle), submits the
    target refuses (reserved, then released), dry runs, validations and lists."""
    spec = REPO / "jobs" / "quickstart.yaml"
    reg = Registry(ddpjob_home)
    for i in range(5):
        reg.reserve(f"seed{i}", "local", {"nodes": 1})
    verbs = [
        ["submit", "-q", "--target", "local", "--name", "quick", "--", "python", "-c", "pass"],
        ["submit", "-q", str(spec), "--target", "k8s"],  # no kubeconfig: refused after its reservation
        ["submit", str(spec), "--dry-run"],
        ["validate", str(spec)],
        ["list", "-o", "json"],
    ]
    cmds = [[sys.executable, "-m", "launcher", *verbs[i % len(verbs)]] for i in range(20)]
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for (rc, out, err), c in zip(outs, cmds):
        if "k8s" in c:
            assert rc == 3 and "kubeconfig" in err, err
            continue
        assert rc == 0, (c, err)
        if "list" in c:
            assert len(json.loads(out)) >= 5
    submitted = [out.strip() for (rc, out, _), c in zip(outs, cmds) if "local" in c]
    with sqlite3.connect(reg.path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = {r[0]: r[1:] for r in conn.execute("SELECT id, state, handle_json, port FROM jobs")}
    assert len(rows) == 5 + 4  # seeds and local submits; refused submits and dry runs leave nothing
    assert len(set(submitted)) == 4 and all(rows[j][1] for j in submitted)  # each has its handle
    assert len({rows[j][2] for j in submitted}) == 4  # and its own port
    for job_id in submitted:  # the local jobs still run to their end
        assert subprocess.run([sys.executable, "-m", "launcher", "wait", job_id, "--timeout", "240"],
                              cwd=REPO, capture_output=True, text=True).returncode == 0


@pytest.mark.parametrize("states,expected", [
    (["SUCCEEDED", "SUCCEEDED"], "SUCCEEDED"),
    (["SUCCEEDED", "RUNNING"], "RUNNING"),
    (["SUCCEEDED", "PENDING"], "RUNNING"),
    (["PENDING", "PENDING"], "PENDING"),
    (["SUCCEEDED", "FAILED"], "FAILED"),
    (["CANCELLED", "SUCCEEDED"], "CANCELLED"),
    (["UNKNOWN", "SUCCEEDED"], "UNKNOWN"),
    ([], "UNKNOWN"),
])
def test_combined_state(states, expected):
    assert combine([JobState(s) for s in states]).value == expected
    assert JobState.parse("no-such-state") == JobState.UNKNOWN
