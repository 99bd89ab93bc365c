"""Reading runs' results (issue 26): the metrics file as any program writes it, the results table and its
orders, and the command line's refusals, without a job (pure tier). Real jobs: test_found_results_real.py."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from launcher.cli import results as cli_results
from launcher.service.results import RunResult, higher_is_better, read_metrics

# What a user's own script may append: the trainer's keys and its own, lines of its own that are not
# metrics (no step, not JSON), a resume that writes step 3 again, a diverged value.
USER_LINES = [
    '{"step": 1, "loss": 2.5, "val_acc": 0.1, "time": 100.0, "epoch": 0, "total_steps": 4}',
    'not json: a line a print() left here',
    '{"event": "start"}',
    '{"step": "2", "loss": 9.0}',
    '{"step": true, "loss": 9.0}',
    '{"step": 2, "loss": 1.5, "flag": true, "note": "text", "time": 101.0}',
    '{"step": 3, "loss": 1.2, "val_acc": 0.6, "time": 102.0}',
    '[1, 2, 3]',
    '{"step": 3, "loss": 1.0, "time": 103.0}',
    '{"step": 4, "loss": NaN, "val_acc": 0.5, "samples_per_s": 100, "time": 104.0}',
    '{"step": 5, "loss": 1.1, "eval_samples": 64',  # cut short by a crash
]


def test_a_users_metrics_file_reads_as_documented(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(USER_LINES) + "\n")
    m = read_metrics(str(path))
    assert set(m.curves) == {"loss", "val_acc", "samples_per_s"}  # no step, time, epoch, total_steps, bools, text
    loss = m.curves["loss"]
    assert [s for s, _ in loss] == [1, 2, 3, 4]  # step order; step 3 once: the later line wins
    assert loss[:3] == [(1, 2.5), (2, 1.5), (3, 1.0)] and math.isnan(loss[3][1])
    assert m.curves["val_acc"] == [(1, 0.1), (3, 0.6), (4, 0.5)]
    assert math.isnan(m.final["loss"]) and m.final["val_acc"] == 0.5 and m.final["samples_per_s"] == 100.0
    assert m.best == {"loss": 1.0, "val_acc": 0.6, "samples_per_s": 100.0}  # NaN is never best; acc: highest
    assert (m.first_time, m.last_time) == (100.0, 104.0)


def test_a_missing_or_empty_metrics_file_is_no_metrics(tmp_path):
    assert read_metrics(str(tmp_path / "absent.jsonl")).curves == {}
    (tmp_path / "empty.jsonl").write_text("")
    m = read_metrics(str(tmp_path / "empty.jsonl"))
    assert (m.curves, m.final, m.best, m.first_time) == ({}, {}, {}, None)


@pytest.mark.parametrize(("name", "higher"), [
    ("loss", False), ("eval_loss", False), ("step_time", False), ("perplexity", False), ("error_rate", False),
    ("eval_accuracy", True), ("val_acc", True), ("f1", True), ("top1", True), ("samples_per_s", True),
    ("tokens_per_sec", True), ("mAP", True), ("lr", False), ("accumulated_loss", False),
])
def test_which_way_is_best(name, higher):
    assert higher_is_better(name) is higher


def _run(index: int, lr: float, loss: float, acc: float | None, state: str = "SUCCEEDED",
         duration: float | None = 12.0) -> RunResult:
    curves = {"loss": [(1, 2.0), (2, loss)], "lr": [(1, lr), (2, lr / 2)]}
    if acc is not None:
        curves["eval_accuracy"] = [(2, acc)]
    final = {k: v[-1][1] for k, v in curves.items()}
    best = {"loss": min(2.0, loss), "lr": lr / 2, **({"eval_accuracy": acc} if acc is not None else {})}
    return RunResult(index, {"lr": lr, "seed": index % 2}, state, duration, final, best, curves, f"/o/sweep-{index}")


RUNS = [_run(0, 0.1, 0.5, 0.8), _run(1, 0.01, 0.3, 0.6), _run(2, 1.0, 0.9, None, "FAILED", None)]


def test_results_table_shows_values_state_duration_and_every_metric():
    lines = cli_results.text_table(RUNS)
    assert lines[0].split() == ["RUN", "lr", "seed", "STATE", "DURATION", "loss", "best", "loss", "eval_accuracy",
                                "best", "eval_accuracy", "last", "lr"]  # main metrics first, then the others
    assert lines[1].split() == ["0", "0.1", "0", "SUCCEEDED", "12.0s", "0.5", "0.5", "0.8", "0.8", "0.05"]
    assert lines[3].split() == ["2", "1.0", "0", "FAILED", "-", "0.9", "0.9", "-", "-", "0.5"]


def test_results_table_has_the_trainers_lr_and_step_time_and_a_users_own_metric():
    """Issue 36 item 4: "any metric of your own" in the text table too, not only in -o json; the step
    split's parts and the peak memory keep their own columns."""
    curves = {"loss": [(1, 1.0)], "lr": [(1, 0.1)], "step_time": [(1, 0.25)], "my_metric": [(1, 7.0)],
              "data_ms": [(1, 1.0)], "compute_ms": [(1, 8.0)], "comm_ms": [(1, 1.0)], "peak_memory_mb": [(1, 300.0)]}
    run = RunResult(0, {}, "SUCCEEDED", 1.0, {k: v[-1][1] for k, v in curves.items()},
                    {k: v[-1][1] for k, v in curves.items()}, curves, "/o")
    header, row = cli_results.text_table([run])
    assert header.split() == ["RUN", "STATE", "DURATION", "loss", "best", "loss", "lr", "my_metric",
                              "best", "my_metric", "step_time", "best", "step_time", "data/compute/comm", "peak", "MiB"]
    assert row.split() == ["0", "SUCCEEDED", "1.0s", "1", "1", "0.1", "7", "7", "0.25", "0.25",
                           "10%/80%/10%", "300"]


def test_results_table_names_a_logged_lr_apart_from_a_swept_lr():
    """A sweep over lr with the trainer logging lr: the sweep's value is "lr", the logged one "last lr"
    (two columns named alike read as one), and a learning rate has no "best"."""
    curves = {"loss": [(1, 1.0)], "lr": [(1, 0.05)]}  # the logged lr: after a warm-up or decay, not the swept 0.1
    run = RunResult(0, {"lr": 0.1}, "SUCCEEDED", 1.0, {k: v[-1][1] for k, v in curves.items()},
                    {k: v[-1][1] for k, v in curves.items()}, curves, "/o")
    header, row = cli_results.text_table([run])
    assert header.split() == ["RUN", "lr", "STATE", "DURATION", "loss", "best", "loss", "last", "lr"]
    assert row.split() == ["0", "0.1", "SUCCEEDED", "1.0s", "1", "1", "0.05"]


def test_sort_by_metric_best_first_by_sweep_value_and_refusal():
    from launcher.core.errors import UsageError

    assert [r.index for r in cli_results.sort_runs(RUNS, "loss")] == [1, 0, 2]
    assert [r.index for r in cli_results.sort_runs(RUNS, "eval_accuracy")] == [0, 1, 2]  # highest first, none last
    assert [r.index for r in cli_results.sort_runs(RUNS, "lr")] == [1, 0, 2]  # lr is a sweep value too: its order
    assert [r.index for r in cli_results.sort_runs(RUNS, "duration")] == [0, 1, 2]
    with pytest.raises(UsageError, match=r"--sort nope: .*metrics: eval_accuracy, loss, lr; sweep values: lr, seed"):
        cli_results.sort_runs(RUNS, "nope")
    bare = [RunResult(0, {}, "PENDING", None, {}, {}, {}, None)]
    assert cli_results.sort_runs(bare, "loss") == bare  # nothing written yet: nothing to refuse


def test_json_and_csv_carry_every_metric_and_no_nan():
    diverged = RunResult(0, {"lr": 9.0}, "FAILED", 1.5, {"loss": math.nan}, {}, {"loss": [(1, math.nan)]}, "/o")
    data = json.loads(json.dumps(cli_results.as_json([RUNS[0], diverged])))
    assert data[0]["final"] == {"eval_accuracy": 0.8, "loss": 0.5, "lr": 0.05} and data[0]["values"] == {"lr": 0.1, "seed": 0}
    assert data[1]["final"] == {"loss": None}
    rows = cli_results.as_csv(RUNS).splitlines()
    assert rows[0] == ("index,lr,seed,state,duration_s,final.eval_accuracy,final.loss,final.lr,"
                       "best.eval_accuracy,best.loss,best.lr,output_dir")
    assert rows[3] == "2,1.0,0,FAILED,,,0.9,0.5,,0.9,0.5,/o/sweep-2"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    from testkit import ddpjob_in_process

    return ddpjob_in_process(*args)


def test_the_command_line_start_imports_no_plotting_library():
    from testkit import start_up_modules

    assert [m for m in ("matplotlib", "tensorboard", "PIL", "numpy") if m in start_up_modules()] == []


def test_help_teaches_with_examples():
    for command, example in (("results", "ddpjob results sweep-ab12c --sort eval_loss"),
                             ("plot", "ddpjob plot sweep-ab12c --metric eval_accuracy -o acc.svg")):
        proc = _cli(command, "--help")
        assert proc.returncode == 0 and example in proc.stdout, proc.stdout


def test_unknown_job_and_wrong_image_name_are_clear_errors():
    proc = _cli("results", "no-such-job")
    assert proc.returncode == 4 and "no job with id 'no-such-job'" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("plot", "no-such-job")
    assert proc.returncode == 4 and "no job with id 'no-such-job'" in proc.stderr
    proc = _cli("plot", "no-such-job", "-o", "curves.jpg")
    assert proc.returncode == 2 and "-o curves.jpg: the image's name must end in .png, .svg or .pdf" in proc.stderr
    proc = _cli("results", "x", "-o", "xml")
    assert proc.returncode == 2 and "'xml' is not one of 'text', 'json', 'yaml', 'csv'" in proc.stderr


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path):
    blocked = tmp_path / "blocked"
    (blocked / "matplotlib").mkdir(parents=True)
    (blocked / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    from testkit import ddpjob

    proc = ddpjob("plot", "any-job", env={"PYTHONPATH": str(blocked)})  # a process: matplotlib is not importable there
    assert proc.returncode == 3, proc.stderr
    assert "ddpjob plot needs matplotlib: pip install 'ddpjob[plot]'" in proc.stderr and "Traceback" not in proc.stderr


def test_trainer_refuses_tensorboard_when_it_is_not_installed(monkeypatch, capsys):
    import importlib.util

    from launcher.train import cli as train_cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        train_cli.parse(["--tensorboard"])
    assert e.value.code == 2
    assert "--tensorboard needs the tensorboard package: pip install 'ddpjob[tensorboard]'" in capsys.readouterr().err
    assert train_cli.parse([]).output.tensorboard is False


def test_a_job_whose_submission_did_not_complete_has_no_runs():
    from launcher.service.registry import Registry

    job_id, _ = Registry().reserve("half", "local", {"name": "half", "command": ["python", "x.py"]})
    proc = _cli("results", job_id, "-o", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"id": job_id, "runs": []}
    assert "no runs: the job's submission did not complete" in proc.stderr
    proc = _cli("plot", job_id)
    assert proc.returncode == 2 and "nothing to plot: no runs" in proc.stderr


def test_results_show_the_nodes_a_run_lost_and_its_goodput():
    """Issue 43: results tell which runs lost nodes and how much of their time went into training kept."""
    import dataclasses

    lossy = dataclasses.replace(RUNS[0], lost_nodes=2, goodput=0.874)
    header, first, second = cli_results.text_table([lossy, RUNS[1]])
    assert header.split()[-3:] == ["lost", "nodes", "goodput"]
    assert first.split()[-2:] == ["2", "87%"] and second.split()[-2:] == ["0", "-"]
    assert "lost" not in cli_results.text_table(RUNS)[0]  # no column where no run lost a node
    data = cli_results.as_json([lossy, RUNS[1]])
    assert (data[0]["lost_nodes"], data[0]["goodput"], data[1]["lost_nodes"], data[1]["goodput"]) == (2, 0.874, 0, None)
