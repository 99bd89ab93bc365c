"""Trainer pieces tested in-process: data, sharding, gradient accumulation, CLI errors."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from launcher.train import data, distcore, loop, models


@pytest.mark.parametrize("n,world", [(51, 2), (10, 3), (7, 4), (3, 8), (100, 1)])
def test_eval_shards_cover_every_sample_once(n, world):
    shards = [distcore.eval_shard(n, r, world) for r in range(world)]
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(n))


def test_cifar_loader_reads_cifar_format_with_str_and_bytes_keys(tiny_cifar, tmp_path):
    train, test, names = data.load_cifar10(str(tiny_cifar), download=False)
    assert train.inputs.shape == (200, 3, 32, 32) and train.inputs.dtype == torch.uint8
    assert test.inputs.shape == (51, 3, 32, 32) and len(test.targets) == 51
    assert names[3] == "class3"
    # the official files use bytes keys: rewrite the test batch that way and read it again
    path = tiny_cifar / "cifar-10-batches-py" / "test_batch"
    with open(path, "rb") as f:
        d = pickle.load(f)
    with open(path, "wb") as f:
        pickle.dump({k.encode(): v for k, v in d.items()}, f)
    assert torch.equal(data.load_cifar10(str(tiny_cifar), download=False)[1].inputs, test.inputs)


def test_missing_cifar_names_the_directory_and_the_flag(tmp_path):
    with pytest.raises(data.DataError) as info:
        data.load_cifar10(str(tmp_path / "nowhere"), download=False)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in str(info.value) and "--download" in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "cifar10", "--data-dir",
                           str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "o")], capture_output=True, text=True)
    assert proc.returncode == 2 and "--download" in proc.stderr and "Traceback" not in proc.stderr


def test_malformed_cifar_is_a_clear_error(tiny_cifar):
    (tiny_cifar / "cifar-10-batches-py" / "data_batch_2").write_bytes(b"not a pickle")
    with pytest.raises(data.DataError, match="data_batch_2 is not a CIFAR-10 batch"):
        data.load_cifar10(str(tiny_cifar), download=False)


def test_synthetic_is_deterministic_and_learnable_shape():
    a, b = data.synthetic(64, 3, "train"), data.synthetic(64, 3, "train")
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, data.synthetic(64, 4, "train").inputs)
    assert a.inputs.shape == (64, 3, 32, 32) and set(a.targets.tolist()) <= set(range(10))
    lin = data.linreg(1000, 0, "train")
    fit = torch.linalg.lstsq(torch.cat([lin.inputs, torch.ones(1000, 1)], 1), lin.targets).solution.flatten()
    assert abs(fit[0] - 2) < 0.05 and abs(fit[1] - 3) < 0.05


def test_augment_crops_and_flips_but_keeps_shape():
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(2, 3, 32, 32)
    out = data.augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    same = data.augment(x, torch.Generator().manual_seed(0))
    assert torch.equal(out, same)


def test_models_have_the_documented_shapes():
    assert models.build("resnet18", "cifar10").conv1.kernel_size == (3, 3)
    assert isinstance(models.build("resnet18", "cifar10").maxpool, nn.Identity)
    mlp = models.build("mlp", "synthetic")
    assert [m.out_features for m in mlp if isinstance(m, nn.Linear)] == [512, 10]
    assert models.build("linear", "linreg")(torch.ones(4, 1)).shape == (4, 1)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("use_ddp", [False, True])
def test_grad_accumulation_equals_a_doubled_batch(use_ddp, tmp_path):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    crit = nn.CrossEntropyLoss()
    big = models.build("mlp", "synthetic")  # unused: proves nothing global is touched
    del big
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    ref.load_state_dict(base.state_dict())
    loop.accumulate_gradients(ref, [(x, y)], crit, torch.device("cpu"), "off", None)
    model = base
    if use_ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        model = nn.parallel.DistributedDataParallel(base)
    try:
        loop.accumulate_gradients(model, [(x[:4], y[:4]), (x[4:], y[4:])], crit, torch.device("cpu"), "off", None)
        for g_acc, g_ref in zip(_grads(models.unwrap(model)), _grads(ref)):
            torch.testing.assert_close(g_acc, g_ref, rtol=1e-5, atol=1e-6)
    finally:
        if use_ddp:
            torch.distributed.destroy_process_group()


def test_help_recommends_ddp():
    out = subprocess.run([sys.executable, "-m", "launcher.train", "--help"], capture_output=True, text=True, check=True).stdout
    assert "recommended" in out and "--strategy" in out and "--amp" in out and "--grad-accum" in out


def test_bad_flags_exit_2():
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "linreg", "--model", "mlp"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--model linear" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--amp", "fp16", "--output-dir", "/tmp/x-fp16"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "bf16" in proc.stderr


@pytest.mark.parametrize("model,amp", [("mlp", "bf16"), ("resnet18", "off")])
def test_bf16_and_resnet18_run_on_cpu(model, amp, tiny_cifar, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "cifar10", "--data-dir", str(tiny_cifar),
                           "--model", model, "--amp", amp, "--batch-size", "8", "--max-steps", "2", "--eval-batch-size", "64",
                           "--epochs", "1", "--output-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["amp"] == amp and summary["steps"] == 2 and summary["eval_samples"] == 51
    assert summary["eval_loss"] == summary["eval_loss"]  # not NaN


def test_dp_strategy_runs_single_process(tmp_path):
    out = tmp_path / "dp"
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--strategy", "dp", "--train-size", "256",
                           "--eval-size", "64", "--epochs", "1", "--output-dir", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["strategy"] == "dp"


def test_evaluate_reduces_sums_not_averages():
    # One process: evaluate() must count every sample and average the per-sample losses exactly.
    info = distcore.DistInfo(0, 1, 0, torch.device("cpu"), False)
    split = data.linreg(37, 1, "eval")
    model = nn.Linear(1, 1)
    args = SimpleNamespace(dataset="linreg", eval_batch_size=5, amp="off")
    ev = loop.evaluate(model, split, args, info)
    with torch.no_grad():
        expected = nn.functional.mse_loss(model(split.inputs), split.targets).item()
    assert ev["eval_samples"] == 37 and abs(ev["eval_loss"] - expected) < 1e-6


def test_lr_warmup_then_cosine():
    args = SimpleNamespace(warmup_steps=4, schedule="cosine")
    f = loop.lr_lambda(args, total_steps=20)
    assert [round(f(s), 3) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and 0 < f(12) < 1 and f(20) == 0.0
    assert loop.lr_lambda(SimpleNamespace(warmup_steps=0, schedule="constant"), 20)(15) == 1.0
