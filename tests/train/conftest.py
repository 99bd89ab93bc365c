"""Fixtures for the trainer tests: a tiny CIFAR-10 in its own on-disk format, torchrun, process cleanup."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
from testkit import descendants


def write_cifar(root: Path, train_batches: int = 5, per_batch: int = 40, test_size: int = 51, seed: int = 0) -> Path:
    """Pickled batches with str keys 'data' (N x 3072 uint8) and 'labels', and batches.meta with label_names.

    Classes are learnable: each has its own mean colour pattern.
    """
    import numpy as np  # here, not at the top: the pure tier collects this folder and needs no numpy

    rng = np.random.default_rng(seed)
    protos = rng.integers(0, 256, size=(10, 3072))
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)

    def batch(n: int) -> dict:
        labels = rng.integers(0, 10, size=n)
        data = (0.6 * protos[labels] + 0.4 * rng.integers(0, 256, size=(n, 3072))).astype(np.uint8)
        return {"batch_label": "tiny", "labels": [int(x) for x in labels], "data": data, "filenames": [f"{i}.png" for i in range(n)]}

    for i in range(1, train_batches + 1):
        with open(d / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch(per_batch), f)
    with open(d / "test_batch", "wb") as f:
        pickle.dump(batch(test_size), f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": per_batch}, f)
    return root


@pytest.fixture
def tiny_cifar(tmp_path: Path) -> Path:
    return write_cifar(tmp_path / "data")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    """A free TCP port for a process group's store."""
    return free_port()


def torchrun(nproc: int, args: list[str], *, max_restarts: int = 0, **kw) -> subprocess.Popen:
    """Start the trainer under a real torchrun (one node, ``nproc`` processes, gloo on CPU)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", str(max_restarts),
           "-m", "launcher.train", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **kw)


@pytest.fixture
def run_torchrun():
    return torchrun


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """A test that fails (or times out) mid-run leaves no torchrun agent or worker behind.

    Anything started under this pytest process during the test and still alive afterwards is
    killed, and the test's direct children are reaped.
    """
    before = set(descendants(os.getpid()))
    yield
    # multiprocessing's resource tracker outlives the test that started it, by design: it stays.
    keep = before | {getattr(resource_tracker._resource_tracker, "_pid", None)}
    left = [p for p in descendants(os.getpid()) if p not in keep]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and set(left) & set(descendants(os.getpid())):
        time.sleep(0.05)
    for pid in left:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap our own (now dead) children
        except ChildProcessError:
            pass  # a grandchild: its parent, killed too, or init reaps it
