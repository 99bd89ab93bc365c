"""How much a plan may describe: nodes x processes x runs is bounded (refused at once, exit 2,
nothing planned) and a large sweep's render is summarised: the first runs in full, then one
line per further run. Time and memory are measured by tests/bench/plan_size_bench.py."""

from __future__ import annotations

import re

import pytest
import yaml

from launcher.core.errors import SpecError
from launcher.spec.load import load_spec
from launcher.spec.size import MAX_PROCESSES


def _sweep_spec(tmp_path, runs: int, nodes: int) -> str:
    spec = tmp_path / "big.yaml"
    spec.write_text(yaml.safe_dump({"name": "big", "image": "img:1", "command": ["python", "t.py", "{i}"],
                                    "nodes": nodes, "procs_per_node": 1, "sweep": {"i": list(range(runs))}},
                                   sort_keys=False))
    return str(spec)


def test_a_plan_of_too_many_processes_is_refused_from_the_spec(tmp_path, monkeypatch):
    from launcher.targets.lookup import target_class

    planned = []
    for name in ("local", "slurm", "k8s"):  # nothing may be planned: the refusal comes first
        cls = target_class(name)
        monkeypatch.setattr(cls, "plan", lambda self, loaded, ctx: planned.append(ctx))
    spec = _sweep_spec(tmp_path, 1000, 1024)
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    text = str(info.value)
    assert f"{spec}:9:1: sweep: the job describes 1,024,000 processes" in text, text
    assert f"at most {MAX_PROCESSES:,}" in text and "split the sweep" in text
    with pytest.raises(SpecError, match="the job describes 1,048,576 processes"):
        load_spec(None, base={"name": "a", "command": ["x"]}, overrides=["nodes=1024", "procs_per_node=1024"])
    assert load_spec(None, base={"name": "a", "command": ["x"]}, overrides=["nodes=1024", "procs_per_node=8"])
    assert planned == []


@pytest.mark.parametrize("target", ["local", "slurm", "k8s"])
def test_the_cli_refuses_it_with_exit_2_and_records_nothing(cli, tmp_path, target):
    spec = _sweep_spec(tmp_path, 1000, 1024)
    for args in (["render", spec], ["submit", spec, "--dry-run"], ["submit", spec]):
        proc = cli(*args, "-t", target)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
        assert "1,024,000 processes" in proc.stderr
    assert cli("list", "-o", "json").stdout.strip() in ("[]", "")


@pytest.mark.parametrize("target", ["local", "slurm", "k8s"])
def test_a_large_sweeps_render_shows_the_first_runs_then_a_line_per_run(cli, tmp_path, target):
    spec = _sweep_spec(tmp_path, 100, 4)  # 100 runs: the summary is the same at 400 (a full k8s render of 400 took 1.5 s)
    proc = cli("render", spec, "-t", target)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "## tasks 3..99: as the tasks above" in out and "DDPJOB_RENDER_RUNS=all" in out
    assert len(re.findall(r"^## task \d+ i=\d+$", out, re.M)) == 97 and "\n## task 99 i=99\n" in out
    if target != "k8s":
        assert out.count("torch.distributed.run") in (3, 3 * 4)  # the first three runs, in full
    else:
        assert out.count("kind: PyTorchJob") == 3 and "100 PyTorchJob(s)" in out
    assert len(out) < 60_000  # every run in full is several times that
    full = cli("render", spec, "-t", target, env={"DDPJOB_RENDER_RUNS": "all"})
    assert full.returncode == 0 and "## tasks 3.." not in full.stdout and len(full.stdout) > 3 * len(out)
    assert full.stdout.startswith(out.split("\n## tasks 3..")[0])  # the same text, cut after the third run
