"""The GPU benchmark's tiny CPU form (tests/bench/gpu_bench.py --form ci), run once so that it keeps working:
every side runs (hand-written loops, the trainer by hand and under ``ddpjob submit``) and the JSON has the
ratios issue 32 asks for. No ratio is judged here: two shared cores say nothing of a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu_bench.py"


def test_gpu_bench_cpu_form_runs_every_side_and_prints_the_ratios(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--form", "ci", "--repeats", "1", "--quiet-wait", "0",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result == json.loads(proc.stdout)
    assert result["form"] == "ci" and result["environment"]["device"] == "cpu"
    for model in ("resnet18", "mlp"):
        m = result["models"][model]
        assert {"hand_nchw", "hand_ddp", "hand_tuned", "trainer", "ddpjob"} <= set(m["images_per_s"]), m
        assert all(v > 0 for v in m["images_per_s"].values())
        assert m["best_hand"] in ("hand_nchw", "hand_ddp", "hand_tuned")
        for ratio in ("trainer_over_best_hand", "ddpjob_over_best_hand", "ddpjob_over_trainer"):
            assert isinstance(m[ratio], float) and m[ratio] > 0, (ratio, m)
        split = m["trainer_split"]["trainer"]
        assert {"data_ms", "compute_ms", "comm_ms"} <= set(split)  # the trainer's own account of its steps
        assert set(result["goals"][model]) == {"ddpjob_over_best_hand >= 0.9", "ddpjob_over_trainer >= 0.97",
                                               "repeats within 10%"}
        assert result["goals"][model]["repeats within 10%"] is None  # one repeat: not judged
