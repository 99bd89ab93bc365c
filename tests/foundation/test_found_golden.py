"""Golden files of the rendered local plan (per-node argv and sorted env). DDPJOB_UPDATE_GOLDEN=1 rewrites them."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from goldens import assert_golden

from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.local.target import LocalTarget
from launcher.targets.shared.launch import torchrun_program, worker_command

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
CTX = PlanContext(job_id="demo-abcde", run_dir="/home/u/.ddpjob/runs/demo-abcde", port=29501, cpu_count=4,
                  gpu_count=0, home="/home/u", cwd="/work/proj", python="/usr/bin/python3")


def check_golden(name: str, text: str) -> None:
    assert_golden(GOLDEN / name, text)


def test_golden_two_node_plan():
    loaded = load_spec(REPO / "jobs" / "quickstart.yaml", overrides=["workdir=/work/proj"])
    plan = LocalTarget().plan(loaded, CTX)
    check_golden("local_quickstart.txt", plan.render())
    nodes = plan.payload.elements[0].nodes
    assert [n.argv[n.argv.index("--node-rank") + 1] for n in nodes] == ["0", "1"]
    for n in nodes:
        argv = n.argv
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--master-port") + 1] == "29501"
        assert argv[argv.index("--max-restarts") + 1] == "1"
        assert n.env["OMP_NUM_THREADS"] == "1"  # cpus: 1 per node, 1 process
        assert list(n.env) == sorted(n.env)
        assert "RANK" not in n.env and "WORLD_SIZE" not in n.env


def test_golden_sweep_plan_with_hostile_strings():
    loaded = load_spec(None, base={
        "name": "demo", "workdir": "/work/proj", "nodes": 2, "procs_per_node": 2,
        "command": ["python", "train.py", "--lr", "{lr}", "--note", "$(touch /tmp/pwned); echo 'x' `id`"],
        "env": {"NOTE": "a b;c", "QUOTE": "it's"}, "nccl": {"debug": "INFO"}, "sweep": {"lr": [0.1, 0.01]},
    })
    plan = LocalTarget().plan(loaded, CTX)
    text = plan.render()
    check_golden("local_sweep_hostile.txt", text)
    assert len(plan.payload.elements) == 2
    # The rendered text is a faithful shell rendering: splitting it gives back the exact argv.
    node = plan.payload.elements[1].nodes[1]
    line = next(ln for ln in text.splitlines() if "--node-rank 1" in ln and "--lr 0.01" in ln)
    assert shlex.split(line.strip().rstrip(")")) == node.argv
    assert node.argv[-1] == "$$(touch /tmp/pwned); echo 'x' `id`"  # $ doubled for torchrun's macros
    assert node.env["NCCL_DEBUG"] == "INFO" and node.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("command,expected", [
    (["python", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    (["python3", "-m", "launcher.train"], ["-m", "launcher.train"]),
    (["/usr/bin/python3.11", "x.py"], ["x.py"]),
    (["python", "-c", "print(1)"], ["--no-python", "/py", "-c", "print(1)"]),
    (["bash", "run.sh"], ["--no-python", "bash", "run.sh"]),
])
def test_torchrun_program(command, expected):
    assert torchrun_program(command, "/py") == expected


@pytest.mark.real  # needs torch (torchrun's own macro substitution)
def test_worker_command_survives_torchrun_macros():
    from torch.distributed.elastic.utils import macros

    for command in (["python", "t.py", "a$$b", "$local_rank", "${local_rank}", "$(id)", "$"],
                    ["bash", "-c", "echo $HOME $$"]):
        args = worker_command(command, "/py")
        program_args = args[2:] if args[0] == "--no-python" else args[1:]
        assert macros.substitute(program_args, "3") == command[-len(program_args):]


@pytest.mark.parametrize("command,said", [
    (["python3.11", "x.py"], True), (["/usr/bin/python3", "x.py"], True), (["/opt/venv/bin/python", "-m", "m"], True),
    (["python", "x.py"], False), (["python3", "-m", "m"], False), (["bash", "run.sh"], False),
])
def test_a_command_that_names_a_python_of_its_own_is_told_it_is_not_used(command, said, tmp_path):
    """Issue 45 item 8: torchrun starts a Python program with its own interpreter, so python3.11 in the
    command is replaced; render says so instead of doing it silently."""
    from click.testing import CliRunner

    from launcher.cli.main import cli

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ncommand: [" + ", ".join(f'"{w}"' for w in command) + "]\n")
    out = CliRunner().invoke(cli, ["render", str(spec), "--target", "local"], catch_exceptions=False).output
    assert (f"# command: {command[0]} is not run as such: torchrun starts a Python program" in out) == said, out
