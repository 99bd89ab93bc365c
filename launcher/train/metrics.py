"""Rank 0's outputs: metrics.jsonl lines, progress lines and summary.json."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from launcher.train.distcore import DistInfo


class Metrics:
    """Rank 0 appends JSON lines to metrics.jsonl and prints a compact progress line."""

    def __init__(self, info: DistInfo, output_dir: str) -> None:
        self.info = info
        self.path = Path(output_dir) / "metrics.jsonl"
        # ddpjob reads a run's progress from $DDPJOB_METRICS_FILE (<output dir>/metrics.jsonl, so the
        # same file unless --output-dir points elsewhere): write there too, so status shows progress.
        target = os.environ.get("DDPJOB_METRICS_FILE")
        self.mirror = Path(target) if target and Path(target) != self.path else None

    def log(self, record: dict[str, Any], line: str | None = None) -> None:
        if not self.info.is_main:
            return
        record = {"time": round(time.time(), 3), **record}
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
        if line:
            print(line, flush=True)


def write_summary(output_dir: str, summary: dict[str, Any]) -> None:
    """summary.json, replaced atomically."""
    path = Path(output_dir) / "summary.json"
    tmp = path.with_name(".summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def eval_line(ev: dict[str, Any]) -> str:
    """``loss 0.1234 accuracy 0.5000 on 51 samples`` (no accuracy for regression)."""
    acc = f" accuracy {ev['eval_accuracy']:.4f}" if ev["eval_accuracy"] is not None else ""
    return f"loss {ev['eval_loss']:.4f}{acc} on {ev['eval_samples']} samples"
