"""Rank 0's outputs: metrics.jsonl lines, progress lines and summary.json; with ``--tensorboard`` the same
metrics as TensorBoard event files."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.train.distcore import DistInfo

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

# Numbers on a metrics line that say where the line is, not how the run does: no TensorBoard scalar
# (ddpjob results reads the file by the same rule: launcher/service/results.py, NOT_METRICS).
NOT_SCALARS = frozenset({"step", "time", "total_steps", "epoch", "world_size", "eval_samples",
                         "checkpoint_step", "checkpoint_world_size", "restart"})


class Metrics:
    """Rank 0 appends JSON lines to metrics.jsonl and prints a compact progress line."""

    def __init__(self, info: DistInfo, output_dir: str, *, tensorboard: bool = False) -> None:
        self.info = info
        self.path = Path(output_dir) / "metrics.jsonl"
        # ddpjob reads a run's progress from $DDPJOB_METRICS_FILE (<output dir>/metrics.jsonl, so the
        # same file unless --output-dir points elsewhere): write there too, so status shows progress.
        target = os.environ.get("DDPJOB_METRICS_FILE")
        self.mirror = Path(target) if target and Path(target) != self.path else None
        self.events: SummaryWriter | None = None
        self.progress_lines = os.environ.get("DDPJOB_PROGRESS_LINES") == "1"  # set in Kubernetes pods
        if tensorboard and info.is_main:
            # Imported only with --tensorboard (cli.check made sure the package is there): ~1.5 s of imports.
            from torch.utils.tensorboard import SummaryWriter

            self.events = SummaryWriter(log_dir=output_dir)

    def log(self, record: Mapping[str, object], line: str | None = None) -> None:
        if not self.info.is_main:
            return
        now = round(time.time(), 3)
        record = {"time": now, **record}
        text = json.dumps(record, sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
        if self.mirror is not None:
            try:
                self.mirror.parent.mkdir(parents=True, exist_ok=True)
                with open(self.mirror, "a", encoding="utf-8") as f:
                    f.write(text)
            except OSError:
                pass  # progress is a help: never a reason to stop training
        if self.events is not None:
            self._scalars(record, now)
        if line:
            print(line, flush=True)
        if self.progress_lines and isinstance(record.get("step"), int):
            # ddpjob reads a pod's progress from such lines (launcher.core.progress.PROGRESS_MARK)
            print("DDPJOB_PROGRESS " + json.dumps(record, sort_keys=True), flush=True)

    def _scalars(self, record: Mapping[str, object], when: float) -> None:
        """Every metric of ``record`` as a scalar at its step, handed to the file at once: TensorBoard's
        writer thread queues events, and the trainer leaves with ``os._exit`` (see ``__main__``), which
        would drop what is still queued."""
        assert self.events is not None
        step = record.get("step")
        step = step if isinstance(step, int) else None  # every line with a metric has one
        for key, value in record.items():
            if key not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.events.add_scalar(key, value, global_step=step, walltime=when)
        self.events.flush()


def write_summary(output_dir: str, summary: Mapping[str, object]) -> None:
    """summary.json, replaced atomically."""
    path = Path(output_dir) / "summary.json"
    tmp = path.with_name(".summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def eval_line(ev: Mapping[str, object]) -> str:
    """``loss 0.1234 accuracy 0.5000 on 51 samples`` (no accuracy for regression)."""
    acc = f" accuracy {ev['eval_accuracy']:.4f}" if ev["eval_accuracy"] is not None else ""
    return f"loss {ev['eval_loss']:.4f}{acc} on {ev['eval_samples']} samples"
