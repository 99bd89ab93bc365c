"""The trainer's typed configuration: built once from the command line (``cli.parse``), read by every module.

Each group holds the options one concern reads. A field is named as its option's argparse ``dest``
(``--log-every`` -> ``log_every``), so ``from_namespace`` fills a group by name and ``as_record``
gives back the flat ``{dest: value}`` a checkpoint keeps under ``"args"``. A new option is one
``add_argument`` in ``cli.py`` and one field in the group that reads it.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Dataset = Literal["cifar10", "synthetic", "linreg"]
ModelName = Literal["linear", "mlp", "resnet18"]
Schedule = Literal["cosine", "constant"]
Amp = Literal["off", "bf16", "fp16"]
Strategy = Literal["ddp", "dp"]
Compression = Literal["none", "fp16", "bf16"]


@dataclass(frozen=True)
class DataConfig:
    """The data set and its loaders."""

    dataset: Dataset
    data_dir: str
    download: bool
    train_size: int
    eval_size: int
    num_workers: int
    eval_batch_size: int


@dataclass(frozen=True)
class OptimConfig:
    """How long and how the model is optimised."""

    epochs: int
    max_steps: int  # 0: no limit
    batch_size: int  # per process
    grad_accum: int
    lr: float
    scale_lr: bool
    warmup_steps: int
    schedule: Schedule
    momentum: float
    weight_decay: float


@dataclass(frozen=True)
class DDPConfig:
    """Data parallelism and the ranks' agreement on stopping."""

    strategy: Strategy
    bucket_cap_mb: float
    grad_compression: Compression
    sync_bn: bool
    stop_check_every: int


@dataclass(frozen=True)
class OutputConfig:
    """Where rank 0 writes, and how often."""

    output_dir: str
    checkpoint_every: int  # 0: at epoch ends only
    checkpoint_seconds: float | None  # timed checkpoints (cadence.py): None auto, 0 off
    log_every: int
    tensorboard: bool  # also TensorBoard event files in output_dir


@dataclass(frozen=True)
class HarnessConfig:
    """Options for the test and benchmark harnesses: they work, but ``--help`` does not list them."""

    step_delay: float  # seconds of sleep after each step: tests slow a run down to signal it mid-way
    bench_no_sync: bool  # every backward inside DDP's no_sync(): the benchmark's bound without communication
    bench_data_delay: float  # seconds of sleep before each batch is ready: a data loader slowed on purpose
    bench_comm_delay: float  # seconds each gradient all-reduce is held before DDP sees it done: a slow network
    bench_no_split: bool  # no step split (StepClock): what measuring it costs
    slow_rank: int = -1  # this rank sleeps slow_rank_delay seconds in each step's compute: a straggler on purpose
    slow_rank_delay: float = 0.0


@dataclass(frozen=True)
class EvalOnlyConfig:
    """``--eval-only``: score a checkpoint instead of training."""

    resume: str  # a checkpoint.pt or the directory holding it
    model: ModelName | None  # --model as given; None: the checkpoint's


@dataclass(frozen=True)
class TrainConfig:
    """One run of the trainer, as the command line asked for it (checked: see ``cli.check``)."""

    model: ModelName  # the model trained (--model, default mlp); --eval-only reads eval_only.model
    seed: int  # model initialisation, shuffling, synthetic data and augmentation
    amp: Amp
    compile: bool  # torch.compile the model (--compile)
    data: DataConfig
    optim: OptimConfig
    ddp: DDPConfig
    output: OutputConfig
    harness: HarnessConfig
    eval_only: EvalOnlyConfig | None = None

    def as_record(self) -> dict[str, object]:
        """The command line as the flat ``{dest: value}`` dict argparse gave (a checkpoint's ``"args"``)."""
        record: dict[str, object] = {
            "model": self.eval_only.model if self.eval_only else self.model, "seed": self.seed, "amp": self.amp,
            "compile": self.compile,
            "eval_only": self.eval_only is not None, "resume": self.eval_only.resume if self.eval_only else None,
        }
        for group in (self.data, self.optim, self.ddp, self.output, self.harness):
            record.update(asdict(group))
        return record


def from_namespace(ns: argparse.Namespace) -> TrainConfig:
    """The config of a parsed (and checked) command line."""
    return TrainConfig(
        model=ns.model or "mlp", seed=ns.seed, amp=ns.amp, compile=ns.compile,
        data=_group(DataConfig, ns), optim=_group(OptimConfig, ns), ddp=_group(DDPConfig, ns),
        output=_group(OutputConfig, ns), harness=_group(HarnessConfig, ns),
        eval_only=EvalOnlyConfig(resume=ns.resume, model=ns.model) if ns.eval_only else None,
    )


G = TypeVar("G", bound="DataclassInstance")


def _group(cls: type[G], ns: argparse.Namespace) -> G:
    return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})
