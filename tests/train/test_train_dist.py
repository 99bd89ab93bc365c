"""The trainer under real torchrun and gloo: exact evaluation, convergence, restarts, preemption, determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from launcher.train import checkpoint, data, distcore, loop, models

SMALL = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "2048", "--eval-size", "101",
         "--batch-size", "64", "--epochs", "2", "--lr", "0.05", "--log-every", "1"]


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def wait_until(pred, timeout=180.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(p: subprocess.Popen, timeout=300) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out
    return out


def test_two_node_cifar_eval_is_exact(cli, tiny_cifar, tmp_path):
    spec = tmp_path / "cifar.yaml"
    out = tmp_path / "out"
    spec.write_text(f"""
name: tiny-cifar
command: [python, -m, launcher.train, --dataset, cifar10, --data-dir, "{tiny_cifar}", --model, mlp,
          --epochs, 2, --batch-size, 16, --lr, 0.01, --checkpoint-every, 3, --output-dir, "{out}"]
nodes: 2
""")
    proc = cli("submit", str(spec), "-f")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["eval_samples"] == 51  # 51 does not divide by 2
    # A single process evaluating the final checkpoint on the same set gets the same numbers.
    ckpt = checkpoint.load(str(out), torch.device("cpu"))
    model = models.build("mlp", "cifar10")
    model.load_state_dict(ckpt["model"])
    _, test, _ = data.load_cifar10(str(tiny_cifar), download=False)
    single = loop.evaluate(model, test, SimpleNamespace(dataset="cifar10", eval_batch_size=7, amp="off"),
                           distcore.DistInfo(0, 1, 0, torch.device("cpu"), False))
    assert single["eval_samples"] == 51
    assert single["eval_accuracy"] == summary["eval_accuracy"]
    assert abs(single["eval_loss"] - summary["eval_loss"]) < 1e-5
    logs = cli("logs", proc.stdout.split()[1]).stdout
    assert "[node0 rank0] rank 0/2" in logs and "[node1 rank1] rank 1/2" in logs


def test_linreg_two_processes_learn_w_and_b(run_torchrun, tmp_path):
    out = tmp_path / "lin"
    p = run_torchrun(2, ["--dataset", "linreg", "--model", "linear", "--epochs", "10", "--batch-size", "32",
                         "--lr", "0.05", "--output-dir", str(out), "--log-every", "50"])
    finish(p)
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 2
    assert abs(s["weight"] - 2) < 0.05 and abs(s["bias"] - 3) < 0.05, s


def _workers_of(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            if ppid == parent and b"launcher.train" in cmd:
                pids.append(int(entry))
    return pids


def test_sigkill_of_a_worker_resumes_from_checkpoint(run_torchrun, tmp_path):
    args = [*SMALL, "--checkpoint-every", "4", "--step-delay", "0.1"]
    ref = tmp_path / "ref"
    finish(run_torchrun(2, [*args, "--output-dir", str(ref)]))
    expected_steps = json.loads((ref / "summary.json").read_text())["steps"]
    assert expected_steps == 2 * (2048 // 2 // 64)

    out = tmp_path / "killed"
    p = run_torchrun(2, [*args, "--output-dir", str(out)], max_restarts=1)
    wait_until(lambda: any(m.get("event") == "checkpoint" and m["step"] >= 8 for m in metrics(out)), what="a checkpoint")
    victims = _workers_of(p.pid)
    assert len(victims) == 2
    os.kill(victims[1], signal.SIGKILL)  # mid-epoch: epoch 0 has 16 steps
    finish(p)
    ms = metrics(out)
    resumes = [m for m in ms if m["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] >= 8
    killed_at = max(m["step"] for m in ms[: ms.index(resumes[0])] if m["event"] == "step")
    assert resumes[0]["step"] <= killed_at < expected_steps
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == expected_steps


def test_sigterm_checkpoints_and_exits_then_resumes(tmp_path):
    out = tmp_path / "term"
    cmd = [sys.executable, "-m", "launcher.train", *SMALL, "--step-delay", "0.05", "--output-dir", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: any(m.get("event") == "step" and m["step"] >= 5 for m in metrics(out)), what="step 5")
    p.send_signal(signal.SIGTERM)
    output, _ = p.communicate(timeout=120)
    assert p.returncode == 0, output
    assert "preempted: checkpoint at step" in output
    first = json.loads((out / "summary.json").read_text())
    assert first["preempted"] is True and first["steps"] < 64
    ckpt = checkpoint.load(str(out), torch.device("cpu"))
    assert ckpt["step"] == first["steps"]
    again = subprocess.run(cmd[:-4] + ["--output-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed from {out / 'checkpoint.pt'} at step {first['steps']}" in again.stdout
    final = json.loads((out / "summary.json").read_text())
    assert final["steps"] == 64 and final["preempted"] is False


def test_same_seed_gives_identical_weights(tmp_path):
    states = []
    for name in ("a", "b"):
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "synthetic", "--model", "mlp", "--train-size",
                        "512", "--eval-size", "64", "--epochs", "1", "--seed", "5", "--output-dir", str(out)],
                       check=True, capture_output=True)
        states.append(checkpoint.load(str(out), torch.device("cpu"))["model"])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
