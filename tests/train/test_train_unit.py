"""Trainer pieces tested in-process: data, sharding, gradient accumulation, CLI errors."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

from launcher.train import checkpoint, cli, data, distcore, evaluation, loop, models, parallel, step
from launcher.train.preempt import StopAgreement

# Real tier: torch itself (its import alone takes ~3 s) and small models trained on the CPU; the pure
# tier needs no torch (.ci/run runs it in a venv without torch).
pytestmark = pytest.mark.real


@pytest.mark.parametrize("n,world", [(51, 2), (10, 3), (7, 4), (3, 8), (100, 1)])
def test_eval_shards_cover_every_sample_once(n, world):
    shards = [list(range(n))[distcore.eval_shard(r, world)] for r in range(world)]
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


def _augment_one_by_one(images, g):
    """The augmentation written the slow, obvious way: per sample, crop the padded image, maybe flip it."""
    n = images.shape[0]
    padded = nn.functional.pad(images, (4, 4, 4, 4))
    offsets = torch.randint(0, 9, (n, 2), generator=g)
    flips = torch.rand(n, generator=g) < 0.5
    out = torch.empty_like(images)
    for i in range(n):
        dy, dx = int(offsets[i, 0]), int(offsets[i, 1])
        crop = padded[i, :, dy : dy + 32, dx : dx + 32]
        out[i] = crop.flip(-1) if flips[i] else crop
    return out


def test_augment_crops_and_flips_the_whole_batch_deterministically():
    x = torch.randint(1, 256, (16, 3, 32, 32), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    out = data.augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    changed = [not torch.equal(out[i], x[i]) for i in range(len(x))]
    assert sum(changed) >= 12, changed  # 1 in 162 samples keeps its centre crop unflipped
    assert (out == 0).any()  # some crops reach into the zero padding
    assert torch.equal(out, data.augment(x, torch.Generator().manual_seed(0)))  # same seed, same batch
    assert not torch.equal(out, data.augment(x, torch.Generator().manual_seed(1)))
    assert torch.equal(out, _augment_one_by_one(x, torch.Generator().manual_seed(0)))


def test_normalize_uses_cifar_mean_and_std():
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    mean, std = torch.tensor(data.CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(data.CIFAR_STD).view(1, 3, 1, 1)
    assert torch.equal(data.normalize(x), (x.float() / 255 - mean) / std)


def test_models_have_the_documented_shapes():
    assert models.build("resnet18", "cifar10").conv1.kernel_size == (3, 3)
    assert isinstance(models.build("resnet18", "cifar10").maxpool, nn.Identity)
    mlp = models.build("mlp", "synthetic")
    assert [m.out_features for m in mlp if isinstance(m, nn.Linear)] == [512, 10]
    assert models.build("linear", "linreg")(torch.ones(4, 1)).shape == (4, 1)


def test_grad_accumulation_equals_a_doubled_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    crit, cpu = nn.CrossEntropyLoss(), torch.device("cpu")
    whole = step.accumulate_gradients(ref, [(x, y)], 1, crit, cpu, "off", None)
    halves = step.accumulate_gradients(model, iter([(x[:4], y[:4]), (x[4:], y[4:])]), 2, crit, cpu, "off", None)
    for g_acc, g_ref in zip((p.grad for p in model.parameters()), (p.grad for p in ref.parameters())):
        torch.testing.assert_close(g_acc, g_ref, rtol=1e-5, atol=1e-6)
    assert halves.dtype == torch.float64 and halves.device == cpu  # the loss stays a tensor: no host sync
    assert whole.dtype == torch.float32  # one micro-batch: the loss itself, no float64 sum (fewer kernels)
    torch.testing.assert_close(halves, whole.detach(), check_dtype=False)


def test_stop_agreement_schedule():
    dist_info = distcore.DistInfo(0, 2, 0, torch.device("cpu"), True)
    every4 = StopAgreement(dist_info, 4)
    assert [s for s in range(1, 13) if every4.due(s, boundary=False)] == [4, 8, 12]
    assert every4.due(6, boundary=True)  # an epoch's end always agrees
    alone = StopAgreement(distcore.DistInfo(0, 1, 0, torch.device("cpu"), False), 4)
    assert all(alone.due(s, boundary=False) for s in range(1, 6))  # one process checks its flag every step


@pytest.mark.parametrize("grad_accum,no_sync_bound,static", [(1, False, True), (2, False, False), (1, True, False)])
def test_static_graph_only_where_valid(grad_accum, no_sync_bound, static):
    cfg = cli.parse(["--grad-accum", str(grad_accum), *(["--bench-no-sync"] if no_sync_bound else [])])
    assert parallel.static_graph_valid(cfg) is static


def test_help_recommends_ddp():
    out = subprocess.run([sys.executable, "-m", "launcher.train", "--help"], capture_output=True, text=True, check=True).stdout
    assert "recommended" in out and "--strategy" in out and "--amp" in out and "--grad-accum" in out
    for flag in ("--eval-only", "--resume CKPT", "--grad-compression {none,fp16,bf16}", "--bucket-cap-mb", "--sync-bn",
                 "--stop-check-every"):
        assert flag in out, flag
    assert "--bench-no-sync" not in out  # the benchmark's switch is not a user option


def test_bad_flags_exit_2():
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "linreg", "--model", "mlp"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--model linear" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--amp", "fp16", "--output-dir", "/tmp/x-fp16"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "bf16" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--eval-only"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--resume CKPT" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--resume", "x.pt"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--eval-only" in proc.stderr


def test_eval_only_refuses_a_missing_or_unfitting_checkpoint(tmp_path):
    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "launcher.train", "--eval-only", "--resume", str(tmp_path / "none.pt"),
                           "--output-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"no checkpoint at {tmp_path / 'none.pt'}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    torch.save({"model": models.build("mlp", "synthetic").state_dict(), "args": {"model": "mlp"}}, tmp_path / "mlp.pt")
    info = distcore.DistInfo(0, 1, 0, torch.device("cpu"), False)
    eval_only = ["--eval-only", "--resume", str(tmp_path / "mlp.pt"), "--output-dir", str(out)]
    cfg = cli.parse([*eval_only, "--model", "resnet18", "--dataset", "synthetic"])
    with pytest.raises(checkpoint.CheckpointError, match="holds a mlp model, not --model resnet18"):
        evaluation.evaluate_checkpoint(cfg, cfg.eval_only, info)
    cfg = cli.parse([*eval_only, "--dataset", "linreg"])
    with pytest.raises(checkpoint.CheckpointError, match="does not fit --dataset linreg"):
        evaluation.evaluate_checkpoint(cfg, cfg.eval_only, info)


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
    # The yardstick is the float64 mean of the float32 outputs; evaluate() sums each batch in float32
    # (the criterion's), so the two differ by float32 rounding only: a few parts in 10^7. Averaging
    # the batches' means instead (the last batch holds 2 samples, not 5) is off by percents.
    torch.manual_seed(0)
    info = distcore.DistInfo(0, 1, 0, torch.device("cpu"), False)
    split = data.linreg(37, 1, "eval")
    model = nn.Linear(1, 1)
    cfg = cli.parse(["--dataset", "linreg", "--model", "linear", "--eval-batch-size", "5"])
    ev = evaluation.evaluate(model, split, cfg, info)
    with torch.no_grad():
        expected = ((model(split.inputs).double() - split.targets.double()) ** 2).mean().item()
    assert ev["eval_samples"] == 37 and abs(ev["eval_loss"] - expected) <= 1e-6 * expected


def test_lr_warmup_then_cosine():
    f = loop.lr_lambda(cli.parse(["--warmup-steps", "4", "--schedule", "cosine"]).optim, total_steps=20)
    assert [round(f(s), 3) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and 0 < f(12) < 1 and f(20) == 0.0
    assert loop.lr_lambda(cli.parse(["--schedule", "constant"]).optim, 20)(15) == 1.0


@pytest.mark.parametrize("epoch,in_epoch,saved,saved_spe,now,want", [
    (0, 6, 192, 10, 192, (0, 6)),  # the same world size: where it was
    (0, 6, 192, 10, 128, (0, 9)),  # 3 ranks of 64 -> 2: 1152 samples in, 9 steps of 128
    (1, 5, 128, 16, 192, (1, 3)),  # 2 -> 3: 640 samples in, 3 whole steps of 192 (64 samples seen twice)
    (0, 10, 192, 10, 128, (1, 0)),  # an epoch's end: the next epoch's start, whatever the world size
])
def test_resume_point_keeps_the_place_in_the_epoch_in_samples(epoch, in_epoch, saved, saved_spe, now, want):
    assert loop.resume_point(epoch, in_epoch, saved_samples_per_step=saved, saved_steps_per_epoch=saved_spe,
                             samples_per_step=now) == want


def test_the_sampler_order_of_an_epoch_is_one_permutation_on_any_world_size():
    """What resume_point rests on: step j's batches over all ranks are the permutation's next samples."""
    from torch.utils.data import DistributedSampler

    n, batch = 96, 4
    order = {}
    for world in (2, 3, 4):
        ranks = [list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=7)) for r in range(world)]
        steps = [sorted(i for r in ranks for i in r[j * batch:(j + 1) * batch]) for j in range(n // world // batch)]
        order[world] = steps
        perm = [i for step_ in steps for i in step_]
        assert len(set(perm)) == len(perm) == n // world // batch * world * batch
    ref = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=7)
    full = list(ref)
    for world, steps in order.items():
        for j, step_ in enumerate(steps):
            assert step_ == sorted(full[j * batch * world:(j + 1) * batch * world]), (world, j)


def test_follow_schedule_is_the_schedule_of_the_new_world_size_from_the_start():
    from launcher.train.config import OptimConfig

    optim = cli.parse(["--lr", "0.1", "--warmup-steps", "3", "--scale-lr"]).optim
    assert isinstance(optim, OptimConfig)

    def fresh(world: int, total: int) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=optim.lr * world)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, loop.lr_lambda(optim, total))

    old_opt, old_sched = fresh(3, 20)
    for _ in range(7):
        old_opt.step()
        old_sched.step()
    new_opt, new_sched = fresh(2, 30)
    base = list(new_sched.base_lrs)
    new_opt.load_state_dict(old_opt.state_dict())  # the checkpoint's rates (world size 3) come with it
    loop.follow_schedule(new_sched, new_opt, base, 10)
    ref_opt, ref_sched = fresh(2, 30)
    for _ in range(10):
        ref_opt.step()
        ref_sched.step()
    assert new_sched.get_last_lr() == ref_sched.get_last_lr()
    for _ in range(5):
        new_opt.step()
        new_sched.step()
        ref_opt.step()
        ref_sched.step()
        assert new_opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]


def test_checkpoint_clock():
    from launcher.train import cadence

    auto = cadence.CheckpointClock(None)
    assert auto.interval() == cadence.AUTO_MIN_S and not auto.due()
    auto.taken(0.01)
    assert auto.interval() == cadence.AUTO_MIN_S  # a cheap checkpoint: as often as the floor allows
    auto.taken(3.0)
    assert auto.interval() == pytest.approx(150.0)  # 2% of the time
    auto.taken(60.0)
    assert auto.interval() == cadence.AUTO_MAX_S
    assert cadence.CheckpointClock(0).interval() is None and not cadence.CheckpointClock(0).due()
    fixed = cadence.CheckpointClock(0.0001)
    import time

    time.sleep(0.001)
    assert fixed.due()
    assert cadence.parse_seconds("AUTO") is None and cadence.parse_seconds("30") == 30.0
    for bad in ("-1", "nan", "1e9", "x"):
        with pytest.raises(ValueError):
            cadence.parse_seconds(bad)
