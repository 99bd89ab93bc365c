#!/usr/bin/env python3
"""The reference trainer against hand-written loops of the same model on the same device; prints JSON.

Every side trains the same model (ResNet-18 with the CIFAR stem, or the MLP 3072-512-10) at the same
batch, with SGD (momentum 0.9), the same autocast, on the same device, each in a fresh process:

- ``hand_nchw``: twenty careful lines of PyTorch: random data already on the device, NCHW, the
  optimiser's default implementation, no host sync but the one that ends a window;
- ``hand_ddp``: the same loop inside DistributedDataParallel, world size 1 (nccl on a GPU, gloo on CPU);
- ``hand_tuned``: the same loop tuned as a careful user would: channels_last and cudnn.benchmark for
  the convolutional model, the fused SGD where the device has it;
- ``hand_compile`` (with ``--compile``): ``hand_tuned`` under torch.compile, warm-up excluded;
- ``trainer``: ``python -m launcher.train --dataset synthetic ...`` started by hand as a plain process;
- ``trainer_compile`` (with ``--compile``): the same with ``--compile``;
- ``ddpjob``: the same trainer command under ``ddpjob submit --nodes 1 -p 1 -f`` (local target: torchrun,
  world size 1, ddpjob's environment);
- ``ddpjob_omp1`` (with ``--omp1``): the same with ``--set local.omp_num_threads=1``;
- ``ddpjob_all_gpus`` (on a machine with 2 or more GPUs): ``-p N``, one rank per GPU (NCCL), the same
  batch per rank: ``scaling_efficiency`` = its global images/s over N times ``ddpjob``'s.

Figures are images/s: every side logs a window every ``window`` steps (the hand loops sync there, as the
trainer reads its loss there), and a side's figure is the median of its windows after the warm-up ones
(two; four for ResNet-18 on the CPU, whose first dozen steps are slow).
Each repeat runs every side once, forwards in even repeats and backwards in odd ones, after waiting for
the machine to go quiet. Ratios are medians of per-repeat ratios (sides of one repeat ran minutes apart
at most): ``trainer_over_best_hand``, ``ddpjob_over_best_hand``, ``ddpjob_over_trainer``; ``spread``
is each side's (max - min) / min over the repeats. ``goals`` says whether issue 32's figures are met;
nothing here fails on a ratio.

Forms: ``gpu`` (ResNet-18 bf16 batch 256, MLP bf16 batch 256, enough steps for steady windows) and
``cpu`` (small sizes that finish in about two minutes per repeat on 2 cores, amp off); ``ci`` (tiny: CI
runs it once through tests/train/test_train_bench.py to keep it working, judging no ratio). ``auto``:
gpu where CUDA is, else cpu.

Usage: python tests/bench/gpu_bench.py [--form auto|cpu|gpu|ci] [--models resnet18,mlp] [--repeats 3]
           [--sides ...] [--compile] [--omp1] [--quiet-wait 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_scaling import wait_for_quiet  # noqa: E402

HAND_SIDES = ("hand_nchw", "hand_ddp", "hand_tuned", "hand_compile")
TRAINER_SIDES = ("trainer", "trainer_compile", "ddpjob", "ddpjob_omp1", "ddpjob_all_gpus")


@dataclass(frozen=True)
class Size:
    """One model's run in one form: batch per process, steps per window, windows per run."""

    batch: int
    window: int
    windows: int
    amp: str
    warmup: int = 2  # windows left out at the start (allocations, cuDNN's and oneDNN's first calls)

    @property
    def steps(self) -> int:
        return self.window * self.windows


FORMS: dict[str, dict[str, Size]] = {
    # ResNet-18 at batch 256 runs ~100 steps/s on an H100: 12 windows of 20 steps is ~2.5 s of training.
    # The MLP is ~20x faster: windows of 100 steps keep a window's sync a small part of it.
    "gpu": {"resnet18": Size(256, 20, 12, "bf16"), "mlp": Size(256, 100, 12, "bf16")},
    # 2 cores: ResNet-18 at batch 16 takes ~0.5 s a step, the MLP at batch 256 ~40 ms.
    # On the CPU ResNet-18's first ~12 steps run up to 5x slower (the allocator growing, oneDNN's first
    # calls): 4 windows of warm-up.
    "cpu": {"resnet18": Size(16, 3, 10, "off", warmup=4), "mlp": Size(256, 20, 8, "off")},
    # CI's run (tests/train/test_train_bench.py): that it works, not what it measures.
    "ci": {"resnet18": Size(8, 2, 3, "off"), "mlp": Size(64, 5, 3, "off")},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def steady(rates: list[float], size: Size) -> float:
    """The figure of one run: the median of its windows after the warm-up ones."""
    kept = rates[size.warmup:] or rates
    return statistics.median(kept)


# ---------------------------------------------------------------------------------------------- hand loops


def hand_loop(variant: str, model_name: str, size: Size, device_name: str) -> dict[str, Any]:
    """Run one hand-written loop in this process; its windows' images/s."""
    import torch
    import torch.nn.functional as F

    from launcher.train.models import build

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    conv = model_name == "resnet18"
    tuned = variant in ("hand_tuned", "hand_compile")
    torch.manual_seed(0)
    if cuda:
        torch.backends.cudnn.benchmark = tuned
    fmt = torch.channels_last if tuned and conv else torch.contiguous_format
    model = build(model_name, "synthetic").to(device, memory_format=fmt)
    opt_kw: dict[str, Any] = {"fused": True} if tuned and _fused_sgd(device) else {}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, **opt_kw)
    net: torch.nn.Module = model
    if variant == "hand_ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1, **({"device_id": device} if cuda else {}))
        net = DDP(model, device_ids=[device.index] if cuda else None)
    compile_s = None
    if variant == "hand_compile":
        net = torch.compile(net)  # type: ignore[assignment]
    pool = [(torch.randn(size.batch, 3, 32, 32, device=device).contiguous(memory_format=fmt),
             torch.randint(0, 10, (size.batch,), device=device)) for _ in range(8)]
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if size.amp == "bf16" else None

    def step(i: int) -> torch.Tensor:
        x, y = pool[i % len(pool)]
        if amp is not None:
            with amp:
                loss = F.cross_entropy(net(x).float(), y)
        else:
            loss = F.cross_entropy(net(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    if variant == "hand_compile":
        t0 = time.perf_counter()
        for i in range(3):
            step(i).item()
        compile_s = round(time.perf_counter() - t0, 2)
    rates = []
    start = time.perf_counter()
    for i in range(1, size.steps + 1):
        loss = step(i)
        if i % size.window == 0:
            loss.item()  # the window's one host sync, as the trainer reads its loss
            now = time.perf_counter()
            rates.append(size.batch * size.window / (now - start))
            start = now
    out: dict[str, Any] = {"windows": [round(r, 1) for r in rates]}
    if compile_s is not None:
        out["compile_s"] = compile_s
    return out


def _fused_sgd(device: Any) -> bool:
    """Whether this torch has a fused SGD for the device (CUDA since 2.1; CPU in newer releases)."""
    import torch

    try:
        p = torch.zeros(1, device=device, requires_grad=True)
        p.grad = torch.zeros(1, device=device)
        torch.optim.SGD([p], lr=0.1, momentum=0.9, fused=True).step()
        return True
    except (RuntimeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------- trainer sides


def trainer_argv(model: str, size: Size, output_dir: str | None, procs: int = 1) -> list[str]:
    argv = ["-m", "launcher.train", "--dataset", "synthetic", "--model", model, "--amp", size.amp,
            "--batch-size", str(size.batch), "--train-size", str(size.batch * size.steps * procs), "--eval-size", "256",
            "--epochs", "1", "--log-every", str(size.window), "--lr", "0.05"]
    return argv + (["--output-dir", output_dir] if output_dir else [])


def compile_seconds(metrics_files: list[Path]) -> float | None:
    """The trainer's logged warm-up under --compile (its ``compile`` event), or None."""
    rows = [json.loads(line) for f in metrics_files for line in f.read_text().splitlines() if line.startswith("{")]
    return next((r.get("seconds") for r in rows if r.get("event") == "compile"), None)


def window_rates(metrics_files: list[Path]) -> tuple[list[float], dict[str, Any]]:
    """Images/s of every logged window after step 1 (step 1 is logged alone: start-up), and the last
    step line's split (what the trainer says its steps were made of)."""
    rows = [json.loads(line) for f in metrics_files for line in f.read_text().splitlines() if line.startswith("{")]
    steps = [r for r in rows if r.get("event") == "step" and r.get("step", 0) > 1]
    last = steps[-1] if steps else {}
    split = {k: last[k] for k in ("data_ms", "compute_ms", "comm_ms", "peak_memory_mb") if k in last}
    return [float(r["samples_per_s"]) for r in steps], split


def run_trainer(side: str, model: str, size: Size, env: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        compile_flag = ["--compile"] if side == "trainer_compile" else []
        if side.startswith("trainer"):
            cmd = [sys.executable, *trainer_argv(model, size, f"{tmp}/out"), *compile_flag]
            run_env = env
        else:
            home = f"{tmp}/home"
            sets = ["--set", "local.omp_num_threads=1"] if side == "ddpjob_omp1" else []
            procs = gpus if side == "ddpjob_all_gpus" else 1  # one rank per GPU: NCCL
            cmd = [sys.executable, "-m", "launcher", "submit", "--target", "local", "--nodes", "1", "-p", str(procs),
                   "--name", f"bench-{model}", *sets, "-f", "--", "python", *trainer_argv(model, size, None, procs)]
            run_env = {**env, "DDPJOB_HOME": home, "DDPJOB_CONFIG": "none", "NO_COLOR": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{side} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        files = sorted(Path(tmp).rglob("metrics.jsonl"))
        rates, split = window_rates(files[:1])
        compile_s = compile_seconds(files[:1])
    if not rates:
        raise SystemExit(f"{side}: no step windows logged in {files}")
    return {"windows": [round(r, 1) for r in rates], **({"split": split} if split else {}),
            **({"compile_s": compile_s} if compile_s is not None else {})}


def run_hand(side: str, model: str, size: Size, device: str, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--hand", side, "--models", model,
           "--size", json.dumps(asdict(size)), "--device", device]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("HAND ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{side} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(line[5:])
    return result


# ---------------------------------------------------------------------------------------------- summary


def paired(runs: dict[str, list[float]], side: str, base: str) -> float | None:
    pairs = [a / b for a, b in zip(runs.get(side, []), runs.get(base, [])) if b]
    return round(statistics.median(pairs), 3) if pairs else None


def summarise(runs: dict[str, list[float]], extra: dict[str, list[dict[str, Any]]], gpus: int) -> dict[str, Any]:
    hands = [s for s in HAND_SIDES if runs.get(s)]
    best = max(hands, key=lambda s: statistics.median(runs[s])) if hands else None
    per_repeat_best = [max(runs[s][i] for s in hands) for i in range(min(len(runs[s]) for s in hands))] if hands else []
    out: dict[str, Any] = {
        "images_per_s": {s: round(statistics.median(v), 1) for s, v in runs.items() if v},
        "runs_images_per_s": {s: [round(x, 1) for x in v] for s, v in runs.items() if v},
        "spread": {s: round((max(v) - min(v)) / min(v), 3) for s, v in runs.items() if v and min(v) > 0},
        "best_hand": best,
    }
    if per_repeat_best:
        runs = {**runs, "best_hand": per_repeat_best}
    out["trainer_over_best_hand"] = paired(runs, "trainer", "best_hand")
    out["ddpjob_over_best_hand"] = paired(runs, "ddpjob", "best_hand")
    out["ddpjob_over_trainer"] = paired(runs, "ddpjob", "trainer")
    if runs.get("ddpjob_omp1"):
        out["ddpjob_omp1_over_ddpjob"] = paired(runs, "ddpjob_omp1", "ddpjob")
    if runs.get("trainer_compile"):
        out["trainer_compile_over_trainer"] = paired(runs, "trainer_compile", "trainer")
    if runs.get("ddpjob_all_gpus") and gpus >= 2:
        # Issue 32 item 5: N GPUs' global images/s over N times one GPU's, both under ddpjob.
        scaled = {**runs, "n_times_one": [gpus * x for x in runs.get("ddpjob", [])]}
        out["scaling_efficiency"] = {"gpus": gpus, "value": paired(scaled, "ddpjob_all_gpus", "n_times_one")}
    elif gpus < 2:
        out["scaling_efficiency"] = f"not measured: {gpus} GPU(s) here; it needs 2 or more"
    for side, results in extra.items():
        splits = [r["split"] for r in results if r.get("split")]
        if splits:
            out.setdefault("trainer_split", {})[side] = splits[-1]
        compiles = [r["compile_s"] for r in results if r.get("compile_s") is not None]
        if compiles:
            out.setdefault("compile_s", {})[side] = compiles
    return out


def goals(models: dict[str, dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Issue 32's figures: under ddpjob >= 0.9x the best hand loop and >= 0.97x the trainer by hand,
    three repeats within 10%."""
    out = {}
    for name, m in models.items():
        spreads = [m["spread"].get(s) for s in ("trainer", "ddpjob") if m["spread"].get(s) is not None]
        g = {
            "ddpjob_over_best_hand >= 0.9": _reached(m.get("ddpjob_over_best_hand"), 0.9),
            "ddpjob_over_trainer >= 0.97": _reached(m.get("ddpjob_over_trainer"), 0.97),
            "repeats within 10%": (max(spreads) <= 0.10) if spreads and repeats >= 3 else None,
        }
        out[name] = g
    return out


def _reached(value: float | None, goal: float) -> bool | None:
    return None if value is None else value >= goal


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host_cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "device": device,
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpus"] = torch.cuda.device_count()
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--form", choices=("auto", "cpu", "gpu", "ci"), default="auto")
    ap.add_argument("--models", default="resnet18,mlp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", default="", help="comma-separated subset of the sides (default: all that apply)")
    ap.add_argument("--compile", action="store_true", help="also hand_compile and trainer_compile (slow warm-up)")
    ap.add_argument("--omp1", action="store_true", help="also ddpjob_omp1 (--set local.omp_num_threads=1)")
    ap.add_argument("--quiet-wait", type=float, default=60,
                    help="before each run, wait up to this many seconds for other work on the machine to stop")
    ap.add_argument("--out", help="also write the JSON to this file")
    ap.add_argument("--hand", help=argparse.SUPPRESS)  # child mode: one hand loop
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hand:
        result = hand_loop(args.hand, args.models, Size(**json.loads(args.size)), args.device)
        print("HAND " + json.dumps(result), flush=True)
        return
    import torch

    cuda = torch.cuda.is_available()
    form = ("gpu" if cuda else "cpu") if args.form == "auto" else args.form
    device = "cuda:0" if cuda and form == "gpu" else "cpu"
    if form == "gpu" and not cuda:
        raise SystemExit("--form gpu needs a GPU: torch sees none here (use --form cpu)")
    models = [m for m in args.models.split(",") if m]
    gpus = torch.cuda.device_count() if device != "cpu" else 0
    sides = [s for s in (*HAND_SIDES, *TRAINER_SIDES)
             if (s not in ("hand_compile", "trainer_compile") or args.compile) and (s != "ddpjob_omp1" or args.omp1)
             and (s != "ddpjob_all_gpus" or gpus >= 2)]
    if args.sides:
        sides = [s for s in sides if s in args.sides.split(",")]
    # The repository first; whatever PYTHONPATH holds after (the GPU machine's carried wheels: gpu_run.sh).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the cpu form on a GPU machine stays on the CPU, every side alike
    runs: dict[str, dict[str, list[float]]] = {m: {} for m in models}
    extra: dict[str, dict[str, list[dict[str, Any]]]] = {m: {} for m in models}
    start = time.perf_counter()
    for rep in range(args.repeats):
        for m in models:
            for side in sides if rep % 2 == 0 else sides[::-1]:
                if side == "hand_tuned" and m == "mlp" and device == "cpu" and not _fused_sgd("cpu"):
                    continue  # nothing to tune: the same loop as hand_nchw
                wait_for_quiet(args.quiet_wait)
                size = FORMS[form][m]
                res = (run_hand(side, m, size, device, env) if side in HAND_SIDES
                       else run_trainer(side, m, size, env, gpus))
                runs[m].setdefault(side, []).append(steady(res["windows"], size))
                extra[m].setdefault(side, []).append(res)
                print(f"# repeat {rep + 1} {m} {side}: {runs[m][side][-1]:.0f} images/s", file=sys.stderr, flush=True)
    summary = {m: summarise(runs[m], extra[m], gpus) for m in models}
    result = {
        "benchmark": "gpu_bench", "form": form, "repeats": args.repeats, "wall_s": round(time.perf_counter() - start, 1),
        "sizes": {m: asdict(FORMS[form][m]) for m in models}, "environment": environment(device),
        "models": summary, "goals": goals(summary, args.repeats),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
