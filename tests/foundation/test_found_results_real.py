"""``ddpjob results`` and ``ddpjob plot`` on real local jobs (issue 26): the example sweep trained by the
reference trainer, a user's own script writing the metrics file, a failed run, a job with no metrics yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import SLEEPER, wait_for

from launcher.service.results import job_results

# jobs/sweep.yaml's command, made small for 2 shared cores (4 runs of a few seconds each).
SMALL_SWEEP = ('command=[python, -m, launcher.train, --dataset, synthetic, --model, mlp, --train-size, "256", '
               '--eval-size, "64", --epochs, "2", --batch-size, "32", --log-every, "2", --lr, "{lr}", --seed, "{seed}"]')

# Not the trainer, not torch: any program that appends JSON lines with a step to $DDPJOB_METRICS_FILE.
USER_SCRIPT = '''
import json, os, sys, time
lr, fail_at = float(sys.argv[1]), int(sys.argv[2])
if os.environ["RANK"] == "0":
    with open(os.environ["DDPJOB_METRICS_FILE"], "a") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "loss": 1.0 / (step * lr), "val_acc": step * lr / 10 + fail_at / 100, "time": time.time()}) + "\\n")
            f.flush()
            if step == fail_at:
                raise SystemExit("boom at step %d" % step)
'''


def _ok(proc) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _colour_pixels(png: Path) -> list[int]:
    """How many pixels of the image have each of the first ten colours of the plot's palette (tab10), but
    its grey (the eighth), which the axes' antialiased text has too: -1 there."""
    import numpy as np
    from matplotlib import colormaps, image

    img = (image.imread(str(png))[..., :3] * 255).round().astype(int)
    counts = []
    for i in range(10):
        colour = np.array([round(c * 255) for c in colormaps["tab10"](i)[:3]])
        counts.append(-1 if i == 7 else int((np.abs(img - colour).max(axis=-1) <= 2).sum()))
    return counts


@pytest.mark.real
def test_example_sweep_results_and_plot(cli, tmp_path):
    job_id = _ok(cli("submit", "jobs/sweep.yaml", "--target", "local", "--nodes", "1", "--set", SMALL_SWEEP,
                     "-q", "-f")).splitlines()[0]
    lines = _ok(cli("results", job_id)).splitlines()
    assert lines[0].split()[:5] == ["RUN", "lr", "seed", "STATE", "DURATION"] and "eval_accuracy" in lines[0]
    rows = [line.split() for line in lines[1:]]
    assert [row[:4] for row in rows] == [["0", "0.1", "1", "SUCCEEDED"], ["1", "0.1", "2", "SUCCEEDED"],
                                         ["2", "0.01", "1", "SUCCEEDED"], ["3", "0.01", "2", "SUCCEEDED"]]
    runs = json.loads(_ok(cli("results", job_id, "-o", "json")))["runs"]
    assert [r["values"] for r in runs] == [{"lr": 0.1, "seed": 1}, {"lr": 0.1, "seed": 2},
                                           {"lr": 0.01, "seed": 1}, {"lr": 0.01, "seed": 2}]  # typed as in the spec
    for r in runs:
        assert {"loss", "eval_loss", "eval_accuracy", "samples_per_s"} <= set(r["final"]) and r["duration_s"] > 0
        assert r["best"]["loss"] <= r["final"]["loss"] and r["best"]["eval_accuracy"] >= r["final"]["eval_accuracy"]
        assert Path(r["output_dir"], "metrics.jsonl").is_file()
    by_acc = json.loads(_ok(cli("results", job_id, "--sort", "eval_accuracy", "-o", "json")))["runs"]
    accs = [r["best"]["eval_accuracy"] for r in by_acc]
    assert accs == sorted(accs, reverse=True)
    bad = cli("results", job_id, "--sort", "nope")
    assert bad.returncode == 2 and "--sort nope: no run of this job has a metric or sweep value 'nope'" in bad.stderr

    png = tmp_path / "loss.png"
    assert f"wrote {png}: loss of 4 task(s)" in _ok(cli("plot", job_id, "-o", str(png)))
    from matplotlib import image

    pixels = image.imread(str(png))
    assert pixels.shape[:2] == (500, 800)  # 8 x 5 inches at 100 dpi
    assert (pixels[..., :3] < 0.9).any(axis=-1).mean() > 0.01  # not blank: axes, text and curves drawn
    log_png = tmp_path / "log.png"
    _ok(cli("plot", job_id, "--log-y", "-o", str(log_png)))
    assert log_png.read_bytes() != png.read_bytes()  # the same curves on another y axis
    counts = _colour_pixels(png)
    assert all(n > 200 for n in counts[:4]) and counts[4:] == [0, 0, 0, -1, 0, 0], counts  # one colour per run, 4 runs
    svg = tmp_path / "acc.svg"
    _ok(cli("plot", job_id, "--metric", "eval_accuracy", "-o", str(svg)))
    text = svg.read_text()
    for label in ("lr=0.1 seed=1", "lr=0.1 seed=2", "lr=0.01 seed=1", "lr=0.01 seed=2"):
        assert f">{label}<" in text  # each curve's legend entry
    bad = cli("plot", job_id, "--metric", "nope", "-o", str(tmp_path / "x.png"))
    assert bad.returncode == 2 and "--metric nope: no run of" in bad.stderr and "eval_loss, loss" in bad.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.real
def test_a_users_own_script_with_a_failed_run(cli, tmp_path):
    (tmp_path / "mine.py").write_text(USER_SCRIPT)
    spec = tmp_path / "mine.yaml"
    spec.write_text(f"""
name: mine
workdir: {tmp_path}
command: [python, mine.py, "{{lr}}", "{{fail}}"]
nodes: 1
sweep:
  lr: [0.5, 2.0]
  fail: [0, 3]
""")
    proc = cli("submit", str(spec), "-q", "-f")
    job_id = proc.stdout.strip().splitlines()[0]
    runs = json.loads(_ok(cli("results", job_id, "-o", "json")))["runs"]
    assert [(r["values"], r["state"]) for r in runs] == [
        ({"lr": 0.5, "fail": 0}, "SUCCEEDED"), ({"lr": 0.5, "fail": 3}, "FAILED"),
        ({"lr": 2.0, "fail": 0}, "SUCCEEDED"), ({"lr": 2.0, "fail": 3}, "FAILED")]
    assert runs[0]["final"] == {"loss": 0.4, "val_acc": 0.25} and runs[0]["best"] == {"loss": 0.4, "val_acc": 0.25}
    assert runs[1]["final"] == pytest.approx({"loss": 2 / 3, "val_acc": 0.18})  # what the failed run wrote before it failed
    assert runs[3]["best"] == pytest.approx({"loss": 1 / 6, "val_acc": 0.63})
    from launcher import api

    mine = api.get(job_id).results()  # the Python API gives the same runs, with their curves
    assert [(r.values, r.state, r.final) for r in mine] == [(r["values"], r["state"], r["final"]) for r in runs]
    assert [s for s, _ in mine[1].curves["loss"]] == [1, 2, 3]
    assert [v for _, v in mine[1].curves["loss"]] == pytest.approx([2.0, 1.0, 2 / 3])
    text = _ok(cli("results", job_id, "--sort", "val_acc"))
    assert text.splitlines()[0].split() == ["RUN", "fail", "lr", "STATE", "DURATION", "loss", "best", "loss",
                                            "val_acc", "best", "val_acc"]
    assert [line.split()[3] for line in text.splitlines()[1:]] == ["SUCCEEDED", "FAILED", "SUCCEEDED", "FAILED"]
    png = tmp_path / "acc.png"
    _ok(cli("plot", job_id, "-m", "val_acc", "-o", str(png)))
    counts = _colour_pixels(png)
    assert all(n > 100 for n in counts[:4]) and counts[4:] == [0, 0, 0, -1, 0, 0], counts


@pytest.mark.real
def test_a_job_with_no_metrics_yet(cli, tmp_path, ddpjob_home):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    job_id = _ok(cli("submit", "--nodes", "1", "-q", "--", "python", "sleeper.py", cwd=tmp_path)).splitlines()[0]
    try:
        from launcher.service.jobs import Jobs

        wait_for(lambda: [r for r in job_results(Jobs(), job_id) if r.state == "RUNNING"], "the run to start")
        proc = cli("results", job_id)
        rows = _ok(proc).splitlines()
        assert rows[0].split() == ["RUN", "STATE", "DURATION"] and rows[1].split()[:2] == ["0", "RUNNING"]
        assert "no metrics yet: each run's program appends JSON lines with a step to $DDPJOB_METRICS_FILE" in proc.stderr
        assert str(ddpjob_home / "runs" / job_id / "output" / "metrics.jsonl") in proc.stderr
        plot = cli("plot", job_id, "-o", str(tmp_path / "x.png"))
        assert plot.returncode == 2 and "nothing to plot: no metrics yet" in plot.stderr
    finally:
        cli("cancel", job_id)
    runs = json.loads(_ok(cli("results", job_id, "-o", "json")))["runs"]
    assert [(r["state"], r["final"], r["values"]) for r in runs] == [("CANCELLED", {}, {})]
