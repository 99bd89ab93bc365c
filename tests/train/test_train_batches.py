"""The in-memory batches (launcher.train.batches) give exactly what a DataLoader over a DistributedSampler
gives, and the step clock splits a step into data, compute and communication (launcher.train.stepclock)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from launcher.train import batches, cli, data, models, step
from launcher.train.loop import fused_sgd, split_text
from launcher.train.stepclock import StepClock

pytestmark = pytest.mark.real  # imports torch


def _sampler(split: data.Split, world: int, rank: int, seed: int = 3) -> DistributedSampler[int]:
    return DistributedSampler(TensorDataset(split.inputs, split.targets), num_replicas=world, rank=rank, shuffle=True,
                              seed=seed, drop_last=False)


def _reference(split: data.Split, world: int, rank: int, bs: int, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the trainer did before: a DataLoader over the sampler, the last partial batch dropped."""
    sampler = _sampler(split, world, rank)
    sampler.set_epoch(epoch)
    return list(DataLoader(TensorDataset(split.inputs, split.targets), batch_size=bs, sampler=sampler, drop_last=True))


@pytest.mark.parametrize("world,rank,bs,skip", [(1, 0, 16, 0), (2, 1, 16, 3), (3, 2, 7, 1), (4, 0, 25, 0)])
@pytest.mark.parametrize("per_epoch", [False, True])
def test_in_memory_batches_are_the_dataloaders_batches(world, rank, bs, skip, per_epoch):
    split = data.synthetic(203, seed=1, split="train")  # 203: the sampler pads, and the last batch is partial
    cpu = torch.device("cpu")
    raw = batches.InMemoryBatches(split, _sampler(split, world, rank), bs, cpu, normalize=False)
    norm = batches.InMemoryBatches(split, _sampler(split, world, rank), bs, cpu, normalize=True)
    assert raw.inputs.dtype == torch.uint8 and norm.inputs.dtype == torch.float32
    # per_epoch is what a GPU holding the split does (one gather for the epoch, views per step): the
    # same batches, checked here on the CPU.
    raw.per_epoch = norm.per_epoch = per_epoch
    for epoch in (0, 1):
        ref = _reference(split, world, rank, bs, epoch)
        assert len(raw) == len(ref) and len(ref) > skip
        seen = 0
        # Drawn one at a time, as the loop does: a batch is valid until the next is drawn.
        for (x, y), (xn, yn), (rx, ry) in zip(raw.epoch(epoch, skip=skip), norm.epoch(epoch, skip=skip), ref[skip:]):
            assert torch.equal(x, rx) and torch.equal(y, ry) and torch.equal(yn, ry)
            # Normalised once up front: the very values normalising each batch gives.
            assert torch.equal(xn, data.normalize(rx))
            assert torch.equal(step.prepare(xn, "synthetic", cpu, None), step.prepare(rx, "synthetic", cpu, None))
            seen += 1
        assert seen == len(ref) - skip == sum(1 for _ in raw.epoch(epoch, skip=skip))


def test_epochs_differ_and_ranks_split_the_data():
    split = data.synthetic(64, seed=0, split="train")
    cpu = torch.device("cpu")
    per_rank = [batches.InMemoryBatches(split, _sampler(split, 2, r), 8, cpu, normalize=False) for r in (0, 1)]
    e0 = [torch.cat([y.clone() for _, y in b.epoch(0)]) for b in per_rank]
    assert not torch.equal(torch.cat([y.clone() for _, y in per_rank[0].epoch(1)]), e0[0])  # a new shuffle each epoch
    assert sorted(torch.cat(e0).tolist()) == sorted(split.targets.tolist())  # 64 = 2 x 4 x 8: every sample once


def test_a_cpu_batch_is_gathered_into_the_same_tensors_each_step():
    split = data.synthetic(64, seed=0, split="train")
    held = batches.InMemoryBatches(split, _sampler(split, 1, 0), 16, torch.device("cpu"), normalize=True)
    it = held.epoch(0)
    (x1, y1), (x2, y2) = next(it), next(it)
    assert x1.data_ptr() == x2.data_ptr() and y1.data_ptr() == y2.data_ptr()  # no allocation per step


def test_cifar_batches_stay_raw_for_augmentation(tiny_cifar):
    train, _, _ = data.load_cifar10(str(tiny_cifar), download=False)
    held = batches.InMemoryBatches(train, _sampler(train, 1, 0), 16, torch.device("cpu"), normalize=False)
    x, _ = next(held.epoch(0))
    assert x.dtype == torch.uint8  # augment() crops and flips uint8 images, before normalising


def test_loader_batches_keep_the_worker_path():
    split = data.synthetic(96, seed=0, split="train")
    held = batches.LoaderBatches(split, _sampler(split, 1, 0), 16, torch.device("cpu"), num_workers=1)
    ref = _reference(split, 1, 0, 16, epoch=2)
    got = list(held.epoch(2, skip=1))
    assert len(got) == len(ref) - 1 and all(torch.equal(a[0], b[0]) for a, b in zip(got, ref[1:]))
    assert "1 worker" in held.where


def test_placement_keeps_a_split_too_big_for_the_budget_raw(monkeypatch):
    split = data.synthetic(32, seed=0, split="train")
    monkeypatch.setattr(batches, "_free_bytes", lambda device: 1000.0)  # far less than 4 x 32 x 3072 bytes
    held = batches.InMemoryBatches(split, _sampler(split, 1, 0), 8, torch.device("cpu"), normalize=True)
    assert held.inputs.dtype == torch.uint8 and held.on_device  # the CPU keeps it where it is, raw
    assert "as stored" in held.where


def test_step_clock_splits_data_compute_and_communication():
    t = iter([0.0, 0.010, 0.040, 0.050, 0.070, 0.071,  # step: data 10, bucket (compute) 30, bucket 10, comm 20, opt 1
              1.0, 1.002, 1.050, 1.051])  # step: data 2, no bucket: compute 48, opt 1
    clock = StepClock(torch.device("cpu"), now=lambda: next(t))
    for buckets in (2, 0):
        clock.begin(0)
        clock.data_ready()
        for _ in range(buckets):
            clock.bucket_ready()
        clock.backward_done()
        clock.step_done()
    split = clock.read()
    assert split is not None and split.steps == 2
    assert split.data_ms == pytest.approx(6.0) and split.comm_ms == pytest.approx(10.0)
    assert split.compute_ms == pytest.approx((30 + 10 + 1 + 48 + 1) / 2)
    assert clock.read() is None  # a new window: nothing measured yet


def test_step_clock_off_and_measuring_real_time():
    off = StepClock(torch.device("cpu"), enabled=False)
    off.begin(0)
    off.data_ready()
    off.step_done()
    assert off.read() is None
    on = StepClock(torch.device("cpu"))
    on.begin(0)
    on.data_ready()
    torch.randn(300, 300) @ torch.randn(300, 300)
    on.backward_done()
    on.step_done()
    split = on.read()
    assert split is not None and split.compute_ms > 0 and split.comm_ms == 0.0


def test_gpu_choices_are_made_for_cuda_only():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert models.channels_last("resnet18", cuda) and not models.channels_last("resnet18", cpu)
    assert not models.channels_last("mlp", cuda)
    assert fused_sgd(cuda) == {"fused": True} and fused_sgd(cpu) == {}
    assert StepClock(cpu).every == 1
    assert split_text([1.0, 3.0, 0.0]) == "data 25% compute 75% comm 0%"


def test_compile_needs_a_c_compiler(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.parse(["--compile"])
    assert e.value.code == 2
    assert cli.parse(["--compile", "--eval-only", "--resume", "x"]).compile  # evaluation compiles nothing
