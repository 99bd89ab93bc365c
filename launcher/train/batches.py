"""Training batches, epoch by epoch, in DistributedSampler's order.

Every data set the trainer knows fits in memory (CIFAR-10 is 150 MB as uint8), so by default its
batches never go through a DataLoader: per-sample indexing and collation of 256 small tensors on the
host, then a copy per step, is what kept a GPU waiting (issue 32). ``InMemoryBatches`` instead holds
the split where the model computes (on the GPU when it fits there); on a GPU it gathers the rank's
shard of each epoch in one indexing operation and hands out each step's batch as a slice of it (no
copy, no kernel and no host work per step); on the CPU it gathers each step's rows in one operation.
Images that need no augmentation are normalised once, up front (the same elementwise operation as
per batch, so the same values). The batches, their order and what a resumed
epoch skips are exactly those of a ``DataLoader`` over a ``DistributedSampler`` with ``drop_last``:
tests/train check them against it.

``--num-workers N`` (N > 0) keeps the classic ``DataLoader`` path (``LoaderBatches``), for comparison
and for data sets of one's own that need workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from launcher.train import data

Batch = tuple[torch.Tensor, torch.Tensor]

# The share of the device's free memory (or of the host's available memory) the held split may take,
# counting a GPU's epoch copy; beyond it the split stays on the host as stored, gathered per step there.
MEMORY_SHARE = 0.25


class EpochBatches(Protocol):
    """What the loop draws batches from."""

    @property
    def where(self) -> str:
        """For the log: where the batches come from."""

    def __len__(self) -> int:
        """Whole batches per epoch (the last partial batch is dropped)."""

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        """The epoch's batches after the first ``skip`` (a resumed epoch), inputs not yet prepared
        unless they are floating point (``step.prepare``). A batch is valid until the next one is
        drawn (on the CPU the next is gathered into the same tensors)."""


class InMemoryBatches:
    """The split held in memory, on the model's device when it fits; see the module's docstring."""

    def __init__(self, split: data.Split, sampler: DistributedSampler[int], batch_size: int, device: torch.device, *,
                 normalize: bool, channels_last: bool = False) -> None:
        self.sampler, self.batch_size, self.device = sampler, batch_size, device
        images = split.inputs.dtype == torch.uint8
        store, normalize = _placement(split, device, normalize=normalize and images)
        inputs = split.inputs.to(store)
        self.inputs = data.normalize(inputs) if normalize else inputs
        self.targets = split.targets.to(store)
        self.on_device = store == device
        self.channels_last = channels_last and images
        # A GPU holding the split gathers the epoch at once; elsewhere each step gathers its rows.
        self.per_epoch = self.on_device and device.type == "cuda"

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    @property
    def where(self) -> str:
        """For the log: where the batches come from."""
        form = "normalised" if self.inputs.is_floating_point() and self.inputs.dim() == 4 else "as stored"
        if self.per_epoch:
            return f"held in GPU memory ({form}), gathered once per epoch, a view per step"
        where = "host memory, copied to the GPU per step" if self.device.type == "cuda" else "memory"
        return f"held in {where} ({form}), gathered per step"

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        n = len(self) * self.batch_size
        order = torch.tensor(list(self.sampler)[:n], dtype=torch.long, device=self.inputs.device)
        bs = self.batch_size
        if self.per_epoch:
            # One gather for the epoch on the GPU (microseconds), then a step's batch is a view: no kernel.
            xs, ys = self.inputs.index_select(0, order), self.targets.index_select(0, order)
            if self.channels_last and xs.is_floating_point():  # (raw images are augmented first: step.prepare)
                xs = xs.contiguous(memory_format=torch.channels_last)  # each slice is then channels_last too
            for i in range(skip, len(self)):
                yield xs[i * bs:(i + 1) * bs], ys[i * bs:(i + 1) * bs]
            return
        # On the host a gather per step: one for the epoch would fault in a fresh copy of the data set
        # (on 2 cores 4-15x slower than gathering each step's rows as they are used). A CPU step is done
        # with its batch before the next is drawn, so each is gathered into the same two tensors: a
        # fresh 3 MB batch each step cost ~0.9 ms of page faults, 7% of an MLP step (0.2 ms reused).
        if self.device.type == "cpu":
            out_x = torch.empty((bs, *self.inputs.shape[1:]), dtype=self.inputs.dtype)
            out_y = torch.empty((bs, *self.targets.shape[1:]), dtype=self.targets.dtype)
            for i in range(skip, len(self)):
                idx = order[i * bs:(i + 1) * bs]
                yield (torch.index_select(self.inputs, 0, idx, out=out_x),
                       torch.index_select(self.targets, 0, idx, out=out_y))
            return
        # To a GPU too small to hold the split: fresh pinned tensors (the caching host allocator knows
        # when each copy is done), so the step's copy runs beside the compute.
        for i in range(skip, len(self)):
            idx = order[i * bs:(i + 1) * bs]
            yield self.inputs.index_select(0, idx).pin_memory(), self.targets.index_select(0, idx).pin_memory()


class LoaderBatches:
    """A ``DataLoader`` with ``--num-workers`` worker processes over the same sampler."""

    def __init__(self, split: data.Split, sampler: DistributedSampler[int], batch_size: int, device: torch.device,
                 num_workers: int) -> None:
        self.sampler = sampler
        self.loader = DataLoader(TensorDataset(split.inputs, split.targets), batch_size=batch_size, sampler=sampler,
                                 drop_last=True, num_workers=num_workers, pin_memory=device.type == "cuda")
        self.where = f"a DataLoader with {num_workers} worker(s)"

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        batches: Iterator[Batch] = iter(self.loader)
        for _ in range(skip):
            next(batches)
        return batches


def _placement(split: data.Split, device: torch.device, *, normalize: bool) -> tuple[torch.device, bool]:
    """Where the split is held and whether it is normalised up front: normalised on the device when that
    fits in ``MEMORY_SHARE`` of its free memory (with the epoch's copy), else raw there, else (a GPU too
    small for it) raw on the host."""
    targets = split.targets.numel() * split.targets.element_size()
    raw = 2 * (split.inputs.numel() * split.inputs.element_size() + targets)
    budget = MEMORY_SHARE * _free_bytes(device)
    if normalize and 2 * (split.inputs.numel() * 4 + targets) <= budget:
        return device, True
    if device.type == "cpu" or raw <= budget:
        return device, False
    return torch.device("cpu"), False


def _free_bytes(device: torch.device) -> float:
    """Free memory of a GPU, or the host's available memory (MemAvailable: page cache counts as free)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return float(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("inf")  # not Linux: the split is in host memory already
