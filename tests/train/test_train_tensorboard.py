"""``--tensorboard`` (issue 26 item 4): a real DDP run on gloo writes TensorBoard event files holding what
metrics.jsonl holds, read back with TensorBoard's own reader."""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("tensorboard", reason="needs tensorboard: pip install 'ddpjob[tensorboard]' (in the dev extra)")


def test_two_processes_write_tensorboard_events_of_their_metrics(run_torchrun, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    p = run_torchrun(2, ["--dataset", "synthetic", "--model", "mlp", "--train-size", "256", "--eval-size", "64",
                         "--epochs", "2", "--batch-size", "32", "--log-every", "2", "--output-dir", str(out),
                         "--tensorboard"])
    log, _ = p.communicate(timeout=300)
    assert p.returncode == 0, log
    events = sorted(out.glob("events.out.tfevents.*"))
    assert len(events) == 1, events  # rank 0 only, in the run's output directory
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, list[tuple[int, float]]] = {}
    for rec in lines:
        for key in ("loss", "lr", "samples_per_s", "step_time", "eval_loss", "eval_accuracy", "data_ms",
                    "compute_ms", "comm_ms"):
            if key in rec:
                expected.setdefault(key, []).append((rec["step"], rec[key]))
    acc = EventAccumulator(str(out))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(expected)  # no step, time, epoch, world_size scalars
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), tag  # stored as float32
    assert expected["loss"][0][0] == 1 and expected["eval_accuracy"][-1][0] == 8  # 2 epochs of 4 steps


@pytest.mark.real
def test_without_the_flag_no_event_files(tmp_path):
    import sys

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "linreg", "--model", "linear",
                           "--train-size", "64", "--eval-size", "16", "--epochs", "1", "--batch-size", "16",
                           "--output-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "metrics.jsonl").is_file() and not list(out.glob("events.out.tfevents.*"))
    help_text = " ".join(subprocess.run([sys.executable, "-m", "launcher.train", "--help"], capture_output=True,
                                        text=True, timeout=60).stdout.split())
    assert "--tensorboard" in help_text and "pip install 'ddpjob[tensorboard]'" in help_text
