"""Why a job is slow, said in one line (issue 32 item 4), on the client's side: the step split on metrics
lines, its shares and advice, and where it is shown (progress line, status, results, the dashboard).
Pure tier; real jobs with a slowed data loader and all-reduce: tests/train/test_train_split.py."""

from __future__ import annotations

import json
import math
import time

import pytest

from launcher.cli import results as cli_results
from launcher.cli.show import status_lines
from launcher.core.progress import Progress, advice, describe, read_progress
from launcher.core.states import JobState
from launcher.core.stepsplit import BOUND_SHARE, StepSplit, run_split
from launcher.service.registry import JobRecord
from launcher.service.results import RunResult
from launcher.ui import pages
from launcher.ui.view import JobView


@pytest.mark.parametrize(("record", "split"), [
    ({"data_ms": 1.0, "compute_ms": 8.0, "comm_ms": 1.0}, StepSplit(1.0, 8.0, 1.0)),
    ({"data_ms": 0, "compute_ms": 5, "comm_ms": 0, "loss": 1.0}, StepSplit(0.0, 5.0, 0.0)),
    ({"data_ms": 1.0, "compute_ms": 8.0}, None),  # a key missing
    ({"data_ms": -1.0, "compute_ms": 8.0, "comm_ms": 1.0}, None),
    ({"data_ms": True, "compute_ms": 8.0, "comm_ms": 1.0}, None),  # a boolean is no number
    ({"data_ms": "1", "compute_ms": 8.0, "comm_ms": 1.0}, None),
    ({"data_ms": math.nan, "compute_ms": 8.0, "comm_ms": 1.0}, None),
    ({"data_ms": math.inf, "compute_ms": 8.0, "comm_ms": 1.0}, None),
    ({"data_ms": 0.0, "compute_ms": 0.0, "comm_ms": 0.0}, None),  # nothing measured
    ({}, None),
])
def test_a_split_is_read_only_from_three_good_numbers(record, split):
    assert StepSplit.of(record) == split


@pytest.mark.parametrize(("data", "compute", "comm", "bound"), [
    (1, 98, 1, None),
    (29, 70, 1, None),  # just under BOUND_SHARE
    (30, 70, 0, "data"),
    (62, 35, 3, "data"),
    (5, 50, 45, "comm"),
    (35, 25, 40, "comm"),  # both over: the larger
    (0, 0.5, 99.5, "comm"),
])
def test_which_part_bounds_a_step(data, compute, comm, bound):
    split = StepSplit(data, compute, comm)
    assert split.bound() == bound
    assert sum(split.shares().values()) == pytest.approx(1.0)
    hint = split.advice()
    if bound is None:
        assert hint is None and "bound" not in split.text()
    elif bound == "data":
        assert hint.startswith(f"data-bound: {round(data)}% of each step waits for its batch")
        assert "--num-workers" in hint and split.text().endswith("(data-bound)")
    else:
        assert hint.startswith("communication-bound: ") and "--grad-compression" in hint and "doctor" in hint
        assert split.text().endswith("(communication-bound)")
    assert BOUND_SHARE == 0.3


def test_text_and_a_runs_mean_without_its_first_window():
    assert StepSplit(3, 85, 12).text() == "data 3% compute 85% comm 12%"
    curves = {"data_ms": [(1, 90.0), (10, 1.0), (20, 3.0)], "compute_ms": [(1, 10.0), (10, 9.0), (20, 7.0)],
              "comm_ms": [(1, 0.0), (10, 0.0), (20, 0.0)]}
    assert run_split(curves) == StepSplit(2.0, 8.0, 0.0)  # step 1 (start-up) left out
    assert run_split({"data_ms": [(1, 1.0)], "compute_ms": [(1, 1.0)], "comm_ms": [(1, 1.0)]}) == StepSplit(1, 1, 1)
    assert run_split({"loss": [(1, 1.0)]}) is None


def _record(**kw: object) -> JobRecord:
    base: dict[str, object] = {
        "id": "demo-ab2cd", "name": "demo", "target": "local", "state": JobState.RUNNING, "spec": {}, "handle": None,
        "run_dir": "/tmp/x", "port": None, "message": "", "created_at": time.time(), "updated_at": time.time(),
        "ended_at": None}
    return JobRecord(**{**base, **kw})  # type: ignore[arg-type]


def _metrics(tmp_path, *lines):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return str(path)


def test_the_progress_line_and_status_carry_the_last_windows_split(tmp_path):
    now = time.time()
    path = _metrics(
        tmp_path,
        {"step": 10, "total_steps": 100, "loss": 1.0, "time": now - 10, "data_ms": 1, "compute_ms": 9, "comm_ms": 0},
        {"step": 20, "total_steps": 100, "loss": 0.5, "time": now, "data_ms": 6, "compute_ms": 3, "comm_ms": 1,
         "peak_memory_mb": 512.0},
        {"step": 20, "event": "eval", "eval_loss": 0.4, "time": now})  # a line without the split comes last
    progress = read_progress(path)
    assert progress is not None and progress.data_ms == 6 and progress.peak_memory_mb == 512.0
    line = describe(progress)
    assert line.startswith("step 20/100, loss 0.5000") and line.endswith("step: data 60% compute 30% comm 10% (data-bound)")
    assert advice(progress).startswith("data-bound: 60% of each step")
    rec = _record(run_dir=str(tmp_path))
    shown = status_lines(rec, None, progress)
    assert any(x.startswith("progress: step 20/100") and "(data-bound)" in x for x in shown)
    assert any(x.startswith("advice:   data-bound: 60%") for x in shown)
    plain = read_progress(_metrics(tmp_path, {"step": 3, "loss": 1.0}))
    assert "step:" not in describe(plain) and advice(plain) is None
    assert not any(x.startswith("advice:") for x in status_lines(rec, None, plain))


def _run(index: int, data: float, compute: float, comm: float, peak: float | None = None) -> RunResult:
    curves = {"loss": [(1, 2.0), (10, 1.0)], "data_ms": [(1, 50.0), (10, data)], "compute_ms": [(1, 1.0), (10, compute)],
              "comm_ms": [(1, 0.0), (10, comm)]}
    if peak is not None:
        curves["peak_memory_mb"] = [(1, peak / 2), (10, peak)]
    final = {k: v[-1][1] for k, v in curves.items()}
    return RunResult(index, {"lr": 0.1 * (index + 1)}, "SUCCEEDED", 3.0, final, dict(final), curves, None)


def test_results_show_the_split_and_advise_per_run():
    runs = [_run(0, 1.0, 9.0, 0.0, peak=2048.0), _run(1, 1.0, 4.0, 5.0)]
    table = cli_results.text_table(runs)
    head = table[0].split()
    assert head[-2:] == ["data/compute/comm", "peak"] or head[-3:] == ["data/compute/comm", "peak", "MiB"]
    assert "data_ms" not in table[0] and "comm_ms" not in table[0]  # no metric columns of their own
    assert "10%/90%/0%" in table[1] and "2048" in table[1]
    assert "10%/40%/50%" in table[2] and table[2].rstrip().endswith("-")  # run 1 wrote no peak memory
    hints = cli_results.advice_lines(runs)
    assert len(hints) == 1 and hints[0].startswith("lr=0.2: communication-bound: 50% of each step")
    # A sweep whose runs all wait on the network: one line, with the range.
    sweep = [_run(0, 1.0, 5.0, 4.0), _run(1, 1.0, 4.0, 5.0), _run(2, 1.0, 5.5, 3.5)]
    assert cli_results.advice_lines(sweep) == [
        "every run: communication-bound: 35-50% of each step waits for the gradient all-reduce after the backward "
        "pass (on the network, or on a slower rank: ranks sharing a machine's cores wait on each other); try a "
        "larger batch per process or --grad-accum, --grad-compression bf16, a larger --bucket-cap-mb, and check the "
        "link between nodes (ddpjob doctor)"]
    mixed = [_run(0, 6.0, 4.0, 0.0), _run(1, 1.0, 4.0, 5.0), _run(2, 0.5, 9.0, 0.5)]
    assert [h.split(":", 2)[:2] for h in cli_results.advice_lines(mixed)] == [["lr=0.1", " data-bound"],
                                                                            ["lr=0.2", " communication-bound"]]
    assert cli_results.advice_lines([_run(0, 6.0, 4.0, 0.0)])[0].startswith("lr=0.1: data-bound: 60%")
    as_json = cli_results.as_json(runs)
    assert as_json[0]["step_split"]["bound"] is None and as_json[1]["step_split"]["bound"] == "comm"
    assert as_json[1]["step_split"]["comm_ms"] == 5.0 and as_json[1]["step_split"]["advice"] == hints[0].split(": ", 1)[1]
    without = [RunResult(0, {}, "SUCCEEDED", 1.0, {"loss": 1.0}, {"loss": 1.0}, {"loss": [(1, 1.0)]}, None)]
    assert "data/compute/comm" not in cli_results.text_table(without)[0] and cli_results.advice_lines(without) == []
    assert cli_results.as_json(without)[0]["step_split"] is None


def test_the_dashboard_shows_the_split_and_its_advice():
    rec = _record(run_dir="/tmp/x")
    runs = [_run(0, 8.0, 2.0, 0.0)]
    progress = Progress(10, 0.0, total_steps=20, loss=1.0, data_ms=8.0, compute_ms=2.0, comm_ms=0.0)
    live = pages.job_live(JobView(rec, None, progress, runs, 0, []), "TOKEN")
    assert "<dt>step</dt><dd>data 80% compute 20% comm 0% (data-bound)" in live
    assert live.count("data-bound: 80% of each step waits for its batch") == 2  # the live fact and the run's row
    assert "Step: data / compute / comm" in live and "80% / 20% / 0%" in live
