"""Models: a linear layer, an MLP (3072 -> 512 -> 10) and ResNet-18 with the CIFAR stem."""

from __future__ import annotations

import torch
from torch import nn


def build(name: str, dataset: str) -> nn.Module:
    if dataset == "linreg":
        if name != "linear":
            raise ValueError("--dataset linreg needs --model linear")
        return nn.Linear(1, 1)
    if name == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 512), nn.ReLU(), nn.Linear(512, 10))
    if name == "resnet18":
        import torchvision

        model: nn.Module = torchvision.models.resnet18(num_classes=10)  # torchvision is untyped
        # CIFAR stem: 32x32 inputs lose too much to a 7x7/2 conv and a max-pool.
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
        return model
    raise ValueError(f"unknown model {name!r}")


def channels_last(name: str, device: torch.device) -> bool:
    """Whether ``name`` computes in channels_last on ``device``: convolutions on a GPU, where cuDNN's
    NHWC kernels (tensor cores) are up to 1.4x faster for ResNet-18 at batch 256 (issue 32's figures).
    On the CPU NCHW stays: oneDNN's gain there is not measured."""
    return name == "resnet18" and device.type == "cuda"


def place(model: nn.Module, name: str, device: torch.device) -> nn.Module:
    """The model on ``device``, in the memory format it computes fastest in there (the trainer and
    ``--eval-only`` alike, so that they compute alike)."""
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if channels_last(name, device) else model


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside torch.compile's wrapper, DDP or DataParallel."""
    compiled = getattr(model, "_orig_mod", None)
    model = compiled if isinstance(compiled, nn.Module) else model
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model

