"""Each start-up trick of ddpjob on and off, side by side (used by cli_bench.py; prints nothing itself).

A trick is switched off by running a variant of the real entry point in a fresh interpreter, never by
a switch in ddpjob's own code:

- CLI (``ddpjob --help`` and ``render`` for each target): ``launcher.cli.entry.main()`` as installed
  (``on``), and with one trick undone by patching ``launcher.cli.entry`` before ``main()`` runs:
  ``gc_tuning`` (Python's default collector thresholds, no freeze at exit), ``pydantic_plugin_standin``
  (pydantic's own plugin discovery).
- local supervisor (a 2-node plan whose nodes run ``python -I -S -c pass``, from the supervisor's start
  to its end, state.json written): as submit starts it (``on``) and without ``quick_plan_reader`` (the
  typed reader of ``launcher.targets.local.payload`` instead of reading the plan submit wrote as it stands).

A hand-written ``TYPE_CHECKING = False`` (to avoid importing ``typing``) was measured the same way
(``import typing`` first) and removed: nothing on --help or render, ~5 ms on the supervisor with its
lower quartile at or below zero in three runs of four (docs/performance.md).

Every repeat runs every variant once, forwards in even repeats and backwards in odd ones. For each
trick the gain is paired per repeat (variant without the trick minus ``on``, in ms: positive means
the trick helps); ``above_noise`` is true when its lower quartile is above zero, i.e. at least three
repeats in four show the gain.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CLI_UNDO = {
    "on": "",
    "gc_tuning": "entry.fewer_collections = lambda: None; entry.gc = types.SimpleNamespace(freeze=lambda: None)",
    "pydantic_plugin_standin": "entry.without_pydantic_plugins = lambda: None",
}
SUPERVISOR_UNDO = {
    "on": "",
    "quick_plan_reader": "supervisor.read_plan = lambda run_dir, from_submit: supervisor._typed_plan(run_dir)",
}
CLI_COMMANDS = {
    "help": ["--help"],
    **{f"render_{t}": ["render", "jobs/cifar.yaml", "--target", t] for t in ("local", "slurm", "k8s")},
}


def _cli_code(undo: str) -> str:
    return "import sys, types; sys.argv[0] = 'ddpjob'; from launcher.cli import entry; " + (undo + "; " if undo else "") \
        + "entry.main()"


def _supervisor_code(undo: str, run_dir: str) -> str:
    boot = f"import sys; sys.path.insert(0, {str(REPO)!r}); "
    return (boot + "from launcher.targets.local.job import supervisor; " + (undo + "; " if undo else "")
            + f"sys.exit(supervisor.main([{run_dir!r}], from_submit=True))")  # as submit starts it


def _timed(cmd: list[str], **kw: object) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - start


def _write_plan(run_dir: Path) -> None:
    """A 2-node local plan whose nodes are plain ``python -I -S -c pass`` processes, as submit writes it."""
    from launcher.targets.local.target import LocalElement, LocalNode, LocalPayload
    from launcher.targets.shared.files import to_json, write_json

    payload = LocalPayload(
        job_id="bench-abcde", run_dir=str(run_dir), nodes=2, procs_per_node=1, port=29999, stop_on_failure=True,
        elements=[LocalElement(index=0, params={}, output_dir=str(run_dir / "output"), nodes=[
            LocalNode(node=n, argv=[sys.executable, "-I", "-S", "-c", "pass"], env={}, cwd=str(run_dir),
                      log=str(run_dir / f"node-{n}.log"), error_file=str(run_dir / f"node-{n}.error.json"),
                      torchrun_log_dir=str(run_dir / f"torchrun-node-{n}")) for n in range(2)])])
    run_dir.mkdir(parents=True)
    write_json(run_dir / "plan.json", to_json(payload))


def _supervised(work: Path, undo: str, count: list[int]) -> float:
    count[0] += 1
    run_dir = work / f"sup-{count[0]}"
    _write_plan(run_dir)
    took = _timed([sys.executable, "-I", "-S", "-c", _supervisor_code(undo, str(run_dir))], cwd=run_dir,
                  stdin=subprocess.DEVNULL)
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state == "SUCCEEDED", state
    shutil.rmtree(run_dir)
    return took


def measure(work: Path, env: dict[str, str], repeats: int) -> dict[str, object]:
    """Samples of every (path, variant), alternating, then the paired gains of each trick."""
    steps = {}
    for cmd, args in CLI_COMMANDS.items():
        for variant, undo in CLI_UNDO.items():
            steps[(cmd, variant)] = (lambda undo=undo, args=args:
                                     _timed([sys.executable, "-c", _cli_code(undo), *args], cwd=REPO, env=env))
    count = [0]
    for variant, undo in SUPERVISOR_UNDO.items():
        steps[("supervisor", variant)] = lambda undo=undo: _supervised(work, undo, count)
    for step in steps.values():  # warm-up: not measured
        step()
    samples: dict[tuple[str, str], list[float]] = {k: [] for k in steps}
    for i in range(repeats):
        for key in (list(steps) if i % 2 == 0 else list(reversed(steps))):
            samples[key].append(steps[key]())
    return summarize(samples)


def summarize(samples: dict[tuple[str, str], list[float]]) -> dict[str, object]:
    paths = sorted({p for p, _ in samples}, key=list(dict.fromkeys(p for p, _ in samples)).index)
    out: dict[str, object] = {}
    for path in paths:
        on = samples[(path, "on")]
        per: dict[str, object] = {"on_s": round(statistics.median(on), 4)}
        for (p, variant), off in samples.items():
            if p != path or variant == "on":
                continue
            gains = [(b - a) * 1000 for a, b in zip(on, off)]
            q1, _, q3 = statistics.quantiles(gains, n=4) if len(gains) >= 2 else (gains[0],) * 3
            per[variant] = {"gain_ms": round(statistics.median(gains), 1), "iqr_ms": [round(q1, 1), round(q3, 1)],
                            "gain_pct": round(100 * statistics.median(gains) / 1000 / statistics.median(on), 1),
                            "above_noise": q1 > 0}
        out[path] = per
    return out


if __name__ == "__main__":  # python tests/bench/startup_tricks.py [REPEATS]: this part of cli_bench.py alone
    import tempfile

    sys.path.insert(0, str(REPO))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "launcher")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp), {**os.environ, "DDPJOB_HOME": str(Path(tmp) / "home")},
                         int(sys.argv[1]) if len(sys.argv) > 1 else 11)
    print(json.dumps({"benchmark": "startup_tricks", "cpu_count": os.cpu_count(), "tricks": result}, indent=1))
