"""kubectl's and squeue's habits (issue 45, item 9): ``-o yaml`` wherever ``-o json`` is, ``list -o wide``,
``list --no-headers`` and ``list --watch``. Jobs are records made in the registry (no job runs); ``--watch``
is stopped by ``DDPJOB_WATCH_ROUNDS`` (``launcher.cli.listing``), and jobs change between two refreshes
through the pause it takes (``listing._pause``)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click
import pytest
import yaml
from testkit import run_in_pty

from launcher.core.states import JobState
from launcher.service.registry import Registry
from launcher.targets.k8s.target import K8sHandle, K8sRun
from launcher.targets.slurm.target import SlurmHandle

REPO = Path(__file__).resolve().parents[2]
CLEAR = "\x1b[H\x1b[2J"


def _jobs(home: Path) -> dict[str, str]:
    """A FAILED local job, an ended Slurm job and an ended Kubernetes sweep of 5 objects: {target: id}."""
    registry = Registry(home)
    local, _ = registry.reserve("one", "local", {"name": "one", "nodes": 2, "env": {"API_TOKEN": "***"}})
    registry.update_state(local, JobState.FAILED, "rank 1 exited 1: boom")
    ids = {"local": local}
    for target, handle in (("slurm", SlurmHandle("", "", slurm_job_id="77", job_dir="/f")),
                           ("k8s", K8sHandle("", "", jobs=[K8sRun(i, f"named-{i}") for i in range(5)]))):
        job_id, _ = registry.reserve(f"t-{target}", target, {"name": f"t-{target}", "nodes": 1})
        handle.job_id, handle.run_dir = job_id, str(registry.runs_dir() / job_id)
        registry.record_handle(job_id, handle.to_json())
        registry.update_state(job_id, JobState.SUCCEEDED, "done")
        ids[target] = job_id
    return ids


# --------------------------------------------------------------------------- -o yaml


def test_every_output_choice_that_has_json_has_yaml_in_any_case():
    """Structural: a command added later with -o json gets -o yaml too, case-insensitive like --state."""
    from launcher.cli.main import cli as root

    def walk(cmd: click.Command, path: str) -> list[tuple[str, click.Choice]]:
        found = [(path, p.type) for p in cmd.params if p.name == "output" and isinstance(p.type, click.Choice)
                 and "json" in p.type.choices]
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            found += walk(sub, f"{path} {name}")
        return found

    found = walk(root, "ddpjob")
    assert {"ddpjob list", "ddpjob status", "ddpjob top", "ddpjob results", "ddpjob doctor",
            "ddpjob config show"} <= {p for p, _ in found}, found
    for path, choice in found:
        assert "yaml" in choice.choices and not choice.case_sensitive, path


def test_yaml_is_the_json_record_in_the_same_order(cli, ddpjob_home):
    ids = _jobs(ddpjob_home)
    for args in (["list"], ["status"], ["status", ids["local"]], ["config", "show"]):
        as_json = cli(*args, "-o", "json", check=True).stdout
        as_yaml = cli(*args, "-o", "YAML", check=True).stdout
        data, loaded = json.loads(as_json), yaml.safe_load(as_yaml)
        assert _without_clock(loaded) == _without_clock(data), args
        first = data[0] if isinstance(data, list) else data
        assert list(loaded[0] if isinstance(loaded, list) else loaded) == list(first), args  # the json's key order
        assert "{" not in as_yaml.splitlines()[0] and not as_yaml.lstrip().startswith("["), as_yaml  # block style
        assert "&id" not in as_yaml and "*id" not in as_yaml  # no anchors or aliases
    status = yaml.safe_load(cli("status", ids["local"], "-o", "yaml").stdout)
    assert status["spec"]["env"] == {"API_TOKEN": "***"} and status["state"] == "FAILED"


def _without_clock(data: object) -> object:
    """list's age_s moves between two calls."""
    if isinstance(data, list):
        return [_without_clock(d) for d in data]
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k != "age_s"}
    return data


def test_yaml_escapes_what_a_terminal_would_run_and_never_folds_a_line():
    from launcher.cli.formats import dumps

    record = {"message": "boom \x1b[2J" + "x" * 300, "id": "a", "nested": {"b": [1, None]}}
    text = dumps(record, "yaml")
    assert "\x1b" not in text and "\\e[2J" in text and len(text.splitlines()) == 6, text
    assert yaml.safe_load(text) == record and list(yaml.safe_load(text)) == ["message", "id", "nested"]
    assert dumps(record, "json", sort_keys=True) == json.dumps(record, indent=2, sort_keys=True)


# --------------------------------------------------------------------------- -o wide, --no-headers


def test_wide_shows_native_ids_procs_runs_and_the_run_dir(cli, ddpjob_home):
    ids = _jobs(ddpjob_home)
    lines = cli("list", "-o", "Wide", check=True).stdout.splitlines()
    assert lines[0].split()[:8] == ["ID", "TARGET", "STATE", "NODES", "PROCS", "RUNS", "AGE", "DURATION"]
    assert "NATIVE ID" in lines[0] and "RUN DIR" in lines[0] and lines[0].rstrip().endswith("MESSAGE")
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[ids["slurm"]][8:10] == ["77", str(ddpjob_home / "runs" / ids["slurm"])]
    assert rows[ids["k8s"]][8] == "named-0,named-1,named-2,+2"  # json has all five
    assert rows[ids["local"]][8:10] == ["-", str(ddpjob_home / "runs" / ids["local"])]
    assert rows[ids["local"]][10:] == ["rank", "1", "exited", "1:", "boom"]  # as many words before the message
    assert "NATIVE" not in cli("list", check=True).stdout  # the plain table is as it was


def test_no_headers_leaves_the_rows_for_a_script(cli, ddpjob_home):
    empty = cli("list", "--no-headers")
    assert empty.returncode == 0 and empty.stdout == "" and "no jobs yet" in empty.stderr
    ids = _jobs(ddpjob_home)
    for output in ("text", "wide"):
        with_head = cli("list", "-o", output, check=True).stdout.splitlines()
        bare = cli("list", "-o", output, "--no-headers", check=True).stdout.splitlines()
        assert [line.split()[0] for line in bare] == list(reversed(ids.values()))
        assert [line.split()[2] for line in bare] == ["SUCCEEDED", "SUCCEEDED", "FAILED"]
        assert len(bare) == len(with_head) - 1 and bare[0][:20] == with_head[1][:20]
    refused = cli("list", "--no-headers", "-o", "json")
    assert refused.returncode == 2 and "--no-headers is for the tables" in refused.stderr and refused.stdout == ""


# --------------------------------------------------------------------------- --watch


def _changing(monkeypatch: pytest.MonkeyPatch, home: Path, steps: list[tuple[str, JobState]]) -> list[float]:
    """Each pause of --watch moves the clock 90 s on (every AGE and a pending job's DURATION change,
    which alone is no change) and applies the next (id, state) of ``steps``; returns the intervals it
    paused for."""
    import time

    import launcher.cli.listing as listing

    paused: list[float] = []
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 90 * len(paused))

    def pause(seconds: float) -> None:
        paused.append(seconds)
        if steps:
            job_id, state = steps.pop(0)
            Registry(home).update_state(job_id, state, f"now {state.value}")

    monkeypatch.setattr(listing, "_pause", pause)
    return paused


def _two_pending(home: Path) -> list[str]:
    registry = Registry(home)
    return [registry.reserve(name, "local", {"name": name, "nodes": 1})[0] for name in ("a", "b")]


def test_watch_piped_prints_the_table_then_only_the_jobs_that_changed(cli, ddpjob_home, monkeypatch):
    a, b = _two_pending(ddpjob_home)
    paused = _changing(monkeypatch, ddpjob_home, [(a, JobState.CANCELLED)])
    proc = cli("list", "-w", "--interval", "0.5", env={"DDPJOB_WATCH_ROUNDS": "3"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert paused == [0.5, 0.5, 0.5]  # 4 listings, 3 pauses
    assert lines[0].startswith("ID ") and [line.split()[:3] for line in lines[1:]] == [
        [b, "local", "PENDING"], [a, "local", "PENDING"], [a, "local", "CANCELLED"]], proc.stdout
    assert lines[3].endswith("now CANCELLED") and "\x1b" not in proc.stdout  # no screen codes in a pipe


def test_watch_prints_a_job_once_more_when_it_leaves_a_state_filter(cli, ddpjob_home, monkeypatch):
    a, b = _two_pending(ddpjob_home)
    _changing(monkeypatch, ddpjob_home, [(a, JobState.FAILED), (b, JobState.SUCCEEDED)])
    proc = cli("list", "-w", "--state", "pending", "--no-headers", env={"DDPJOB_WATCH_ROUNDS": "3"})
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[:3] for line in proc.stdout.splitlines()] == [
        [b, "local", "PENDING"], [a, "local", "PENDING"], [a, "local", "FAILED"], [b, "local", "SUCCEEDED"]]


def test_watch_streams_a_json_line_or_a_yaml_document_per_changed_job(cli, ddpjob_home, monkeypatch):
    a, b = _two_pending(ddpjob_home)
    _changing(monkeypatch, ddpjob_home, [(b, JobState.CANCELLED)])
    proc = cli("list", "-w", "-o", "json", env={"DDPJOB_WATCH_ROUNDS": "2"})
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["id"], r["state"]) for r in records] == [(b, "PENDING"), (a, "PENDING"), (b, "CANCELLED")]
    assert set(records[0]) == set(json.loads(cli("list", "-o", "json").stdout)[0])  # list -o json's record

    _changing(monkeypatch, ddpjob_home, [(a, JobState.CANCELLED)])
    proc = cli("list", "-w", "-o", "yaml", env={"DDPJOB_WATCH_ROUNDS": "2"})
    assert proc.returncode == 0 and proc.stdout.startswith("---\n"), proc.stdout
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [(d["id"], d["state"]) for d in docs] == [(b, "CANCELLED"), (a, "PENDING"), (a, "CANCELLED")]


def test_watch_ends_with_exit_0_on_ctrl_c_and_refuses_odd_intervals(cli, ddpjob_home, monkeypatch):
    import launcher.cli.listing as listing

    _two_pending(ddpjob_home)

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(listing, "_pause", ctrl_c)
    proc = cli("list", "--watch")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "Stopped" not in proc.stderr, proc.stderr
    assert len(proc.stdout.splitlines()) == 3
    for args, words in ((["--interval", "0.1"], "0.1 is not in the range 0.5<=x<=3600"),
                        (["--interval", "nan"], "'nan' is not a number of seconds"), (["--interval", "5"], "add --watch")):
        refused = cli("list", *args, *(["-w"] if "add --watch" not in words else []))
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr


def test_watch_on_a_terminal_redraws_in_place_until_ctrl_c(ddpjob_home):
    """In a real process on a pseudo-terminal: the screen is cleared before each listing, and Ctrl-C
    (the terminal's SIGINT) ends it with exit 0 and no traceback."""
    a, b = _two_pending(ddpjob_home)
    argv = [sys.executable, "-m", "launcher", "list", "-w", "--interval", "0.5"]
    code, out = run_in_pty(argv, cwd=REPO, env=dict(os.environ), answers=((f"{a}", "\x03"),), timeout=60)
    assert code == 0 and "Traceback" not in out and out.startswith(CLEAR), out
    assert "every 0.5s: ddpjob list" in out and b in out
    code, out = run_in_pty(argv + ["-o", "wide"], cwd=REPO, env={**os.environ, "DDPJOB_WATCH_ROUNDS": "1"}, timeout=60)
    assert code == 0 and out.count(CLEAR) == 2 and out.count("NATIVE ID") == 2, out


def test_the_commands_page_shows_every_option_of_list_and_yaml_wherever_json_is():
    from launcher.cli.main import cli as root

    page = (REPO / "docs" / "commands.md").read_text()
    synopsis = page.split("```")[1]
    list_line = next(line for line in synopsis.splitlines() if line.startswith("ddpjob list "))
    for param in root.commands["list"].params:
        assert any(o in list_line for o in param.opts), param.opts
    assert "-o wide|json|yaml" in list_line
    for command in ("status", "doctor", "config show", "results", "top"):
        line = next(line for line in synopsis.splitlines() if line.startswith(f"ddpjob {command} "))
        assert "json|yaml" in line, line


def test_watch_ends_quietly_when_the_reader_of_its_pipe_leaves(ddpjob_home):
    """``ddpjob list -w | head -1``: nothing changes, so nothing more is written that would fail; the
    watch still sees at its next refresh that the pipe has no reader, and ends with exit 0."""
    import subprocess

    _two_pending(ddpjob_home)
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "list", "-w", "--interval", "0.5"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ID ")
    proc.stdout.close()
    try:
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 0 and "Traceback" not in proc.communicate()[1]


@pytest.mark.parametrize("state", [JobState.FAILED, JobState.CANCELLED, JobState.SUCCEEDED])
def test_a_sweep_that_has_ended_lists_all_its_runs_ended_not_a_question_mark(state):
    """``list`` showed ``runs ?/2`` for a failed sweep: its runs were not asked again once it ended."""
    from launcher.service.queue import Entry
    from launcher.service.records import JobRecord, JobShape

    rec = JobRecord(id="sw-abcde", name="sw", target="local", state=state, spec={}, handle={"run_dir": "/r"},
                    run_dir="/r", port=None, message="2 failed", created_at=0.0, updated_at=0.0, ended_at=1.0,
                    shape=JobShape(runs=2, nodes=1, procs_per_node=1))
    assert Entry(rec, None).runs() == (2, 2)
    assert Entry(dataclasses.replace(rec, state=JobState.RUNNING), None).runs() == (None, 2)
