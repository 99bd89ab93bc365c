"""Data sets: CIFAR-10 from its standard on-disk format, a learnable synthetic CIFAR, and linreg.

The CIFAR-10 loader reads the python pickles itself instead of using torchvision's ``CIFAR10``,
which checks the MD5 of every file (``batches.meta`` included) and so refuses any well-formed copy
that is not byte-identical to the official release. Checksums are verified only for an archive
that ``--download`` fetched.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tarfile
import tempfile
import urllib.request
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from launcher.train.config import DataConfig

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class DataError(Exception):
    """A data set is missing or malformed; the message says what to do."""


@dataclass
class Split:
    """Tensors of one split. ``images`` are uint8 (N, 3, 32, 32) for image sets, float (N, 1) for linreg."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)


def _unpickle(path: Path) -> dict[str, object]:
    with open(path, "rb") as f:
        data = pickle.load(f, encoding="bytes")
    # The official files use bytes keys; copies written by other tools often use str keys.
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in data.items()}


def _read_batch(path: Path) -> Split:
    try:
        d = _unpickle(path)
        raw = d["data"]
        # Whatever the pickle holds: anything but a sequence of ints fails below with TypeError/ValueError.
        labels = d.get("labels", d.get("fine_labels"))
        images = torch.as_tensor(_image_bytes(raw), dtype=torch.uint8)
        if not isinstance(labels, Collection):
            raise TypeError(f"object of type '{type(labels).__name__}' has no len()")  # as len() says
        n = len(labels)
        images = images.reshape(n, 3, 32, 32)
        return Split(images, torch.as_tensor(list(labels), dtype=torch.long))
    except (OSError, KeyError, ValueError, RuntimeError, pickle.UnpicklingError, TypeError) as e:
        raise DataError(f"{path} is not a CIFAR-10 batch (expected a pickle with 'data' (N x 3072 uint8) and 'labels'): {e}") from e


def _image_bytes(raw: object) -> bytearray:
    """A batch's pixels as bytes: a numpy array's (``tobytes``), or what ``bytearray`` makes of the value."""
    if hasattr(raw, "tobytes"):
        return bytearray(raw.tobytes())
    if not isinstance(raw, (int, Iterable)):
        raise TypeError(f"cannot convert '{type(raw).__name__}' object to bytearray")  # as bytearray() says
    return bytearray(raw)


def _cifar_root(data_dir: str, download: bool) -> Path:
    root = Path(data_dir) / CIFAR_DIR
    if not root.is_dir():
        if not download:
            raise DataError(
                f"CIFAR-10 not found: {root} does not exist. Put the extracted data set there "
                f"(data_batch_1..5, test_batch, batches.meta) or pass --download to fetch it"
            )
        fetch_cifar10(Path(data_dir))
    if not sorted(root.glob("data_batch_*")) or not (root / "test_batch").exists():
        raise DataError(f"{root} has no data_batch_* or test_batch files; re-extract the data set or pass --download")
    return root


def load_cifar10(data_dir: str, download: bool) -> tuple[Split, Split, list[str]]:
    root = _cifar_root(data_dir, download)
    parts = [_read_batch(p) for p in sorted(root.glob("data_batch_*"))]
    train = Split(torch.cat([p.inputs for p in parts]), torch.cat([p.targets for p in parts]))
    test = _read_batch(root / "test_batch")
    names = [str(i) for i in range(10)]
    if (root / "batches.meta").exists():
        meta = _unpickle(root / "batches.meta")
        found = meta.get("label_names", names)
        if not isinstance(found, Iterable):
            raise TypeError(f"'{type(found).__name__}' object is not iterable")  # as iterating it says
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in found]
    return train, test, names


def fetch_cifar10(data_dir: Path) -> None:
    """Download the official archive, verify its MD5, extract it (no path escapes)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=data_dir, suffix=".tar.gz", delete=False) as tmp:
        try:
            with urllib.request.urlopen(CIFAR_URL, timeout=60) as resp:
                md5 = hashlib.md5()
                while chunk := resp.read(1 << 20):
                    md5.update(chunk)
                    tmp.write(chunk)
        except OSError as e:
            os.unlink(tmp.name)
            raise DataError(f"could not download {CIFAR_URL}: {e}") from e
    if md5.hexdigest() != CIFAR_MD5:
        os.unlink(tmp.name)
        raise DataError(f"downloaded archive has MD5 {md5.hexdigest()}, expected {CIFAR_MD5}")
    with tarfile.open(tmp.name) as tar:
        tar.extractall(data_dir, filter="data")
    os.unlink(tmp.name)


def synthetic(size: int, seed: int, split: str) -> Split:
    """CIFAR-shaped images whose class is learnable: a fixed per-class pattern plus noise.

    The patterns depend only on ``seed``; train and eval draw different noise and labels.
    """
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(10, 3, 32, 32, generator=g)
    g.manual_seed(seed * 7919 + (1 if split == "train" else 2))
    labels = torch.randint(0, 10, (size,), generator=g)
    noise = torch.rand(size, 3, 32, 32, generator=g)
    images = (0.1 * prototypes[labels] + 0.9 * noise) * 255
    return Split(images.to(torch.uint8), labels)


def linreg(size: int, seed: int, split: str) -> Split:
    """y = 2x + 3 + 0.1 * noise, x uniform in [-1, 1]."""
    g = torch.Generator().manual_seed(seed * 7919 + (1 if split == "train" else 2))
    x = torch.rand(size, 1, generator=g) * 2 - 1
    y = 2 * x + 3 + 0.1 * torch.randn(size, 1, generator=g)
    return Split(x, y)


@functools.cache
def _mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: building them per call costs two host-to-device copies every batch.
    mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
    return mean, std


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, 32, 32) -> float, normalised with CIFAR-10's mean and std, on the batch's device."""
    mean, std = _mean_std(images.device)
    return images.float().div_(255).sub_(mean).div_(std)


_CROP = 32
_PAD = 4


def augment(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Standard CIFAR training augmentation on a uint8 batch: random 32x32 crop of the 4-padded image, h-flip.

    The whole batch is cropped and flipped by one gather on the batch's device (5-8x faster than a
    per-sample loop on CPU). The random draws come from ``g``, a CPU generator, so a seed gives the
    same batch on every device; they travel in one small copy.
    """
    n, c, dev = images.shape[0], images.shape[1], images.device
    offsets = torch.randint(0, 2 * _PAD + 1, (n, 2), generator=g)
    flips = torch.rand(n, generator=g) < 0.5
    draws = torch.cat([offsets, flips.long().unsqueeze(1)], 1).to(dev, non_blocking=True)
    padded = torch.nn.functional.pad(images, (_PAD, _PAD, _PAD, _PAD))
    width = _CROP + 2 * _PAD
    ar = torch.arange(_CROP, device=dev)
    rows = draws[:, 0:1] + ar  # (n, 32)
    cols = draws[:, 1:2] + torch.where(draws[:, 2:3].bool(), _CROP - 1 - ar, ar)  # a flip reads columns backwards
    flat = (rows.unsqueeze(2) * width + cols.unsqueeze(1)).view(n, 1, _CROP * _CROP).expand(n, c, _CROP * _CROP)
    return padded.view(n, c, width * width).gather(2, flat).view(n, c, _CROP, _CROP)


def load(cfg: DataConfig, seed: int) -> tuple[Split, Split]:
    """The train and eval splits the data options name."""
    if cfg.dataset == "cifar10":
        train, test, _ = load_cifar10(cfg.data_dir, cfg.download)
        return train, test
    if cfg.dataset == "synthetic":
        return synthetic(cfg.train_size, seed, "train"), synthetic(cfg.eval_size, seed, "eval")
    return linreg(cfg.train_size, seed, "train"), linreg(cfg.eval_size, seed, "eval")


def load_eval(cfg: DataConfig, seed: int) -> Split:
    """The eval split alone (``--eval-only`` reads or makes no training data)."""
    if cfg.dataset == "cifar10":
        return _read_batch(_cifar_root(cfg.data_dir, cfg.download) / "test_batch")
    if cfg.dataset == "synthetic":
        return synthetic(cfg.eval_size, seed, "eval")
    return linreg(cfg.eval_size, seed, "eval")
