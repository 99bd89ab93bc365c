"""Slurm target without a cluster: the slurm: spec section, golden sbatch scripts, quoting of hostile
strings, render == submitit's own script, and the pure parsers of sacct/squeue/scontrol output.

Golden files live in tests/slurm/golden; DDPJOB_UPDATE_GOLDEN=1 rewrites them.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from goldens import assert_golden
from testkit import ddpjob_in_process

from launcher.core.errors import SpecError
from launcher.core.quantity import parse_memory, slurm_mem
from launcher.core.states import JobState
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.slurm.job.nodelist import expand_nodelist
from launcher.targets.slurm.options import time_to_minutes
from launcher.targets.slurm.payload import node_argv, node_env
from launcher.targets.slurm.query import (
    SLURM_STATES,
    expand_job_id,
    map_state,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
    query,
)
from launcher.targets.slurm.target import SlurmTarget

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
CTX = PlanContext(job_id="demo-abcde", run_dir="/home/u/.ddpjob/runs/demo-abcde", port=None, cpu_count=4,
                  gpu_count=0, home="/home/u", cwd="/work/proj", python="/usr/bin/python3")
HOSTILE = ["$(touch /tmp/pwned)", "'; rm -rf ~'", "`id`", 'a"b', "x;y|z&", "$HOME", "*"]


def check_golden(name: str, text: str) -> None:
    assert_golden(GOLDEN / name, text)


def plan_of(path: str | None = None, sets: list[str] = (), base: dict | None = None):  # type: ignore[assignment]
    loaded = load_spec(REPO / path if path else None, overrides=["workdir=/work/proj", *sets], base=base)
    return SlurmTarget().plan(loaded, CTX)


def sbatch_flags(script: str) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, sep, value = line[len("#SBATCH --"):].partition("=")
            out[key] = shlex.split(value)[0] if sep else True
    return out


def srun_line(script: str) -> list[str]:
    return shlex.split(next(ln for ln in script.splitlines() if ln.startswith("srun ")))


# --------------------------------------------------------------------------- golden scripts

def test_golden_single_node_job():
    plan = plan_of("jobs/quickstart.yaml", ["nodes=1", "slurm.partition=debug", "slurm.time=30"])
    check_golden("slurm_single.txt", plan.render())
    flags = sbatch_flags(plan.payload.script)
    assert flags["nodes"] == "1" and flags["ntasks-per-node"] == "1" and flags["partition"] == "debug"
    assert flags["time"] == "30" and flags["signal"] == "USR2@90" and flags["requeue"] is True
    assert "array" not in flags
    assert "--nnodes 1 --node-rank \"$SLURM_NODEID\"" in plan.render()


def test_golden_two_node_job():
    plan = plan_of("jobs/quickstart.yaml", ["slurm.account=proj1", "slurm.qos=high", "slurm.constraint=a100|h100",
                                            "slurm.exclusive=true", "resources.gpus=4", "slurm.time=1-02:00:00"])
    check_golden("slurm_two_node.txt", plan.render())
    flags = sbatch_flags(plan.payload.script)
    assert flags["nodes"] == "2" and flags["gpus-per-node"] == "4" and flags["exclusive"] is True
    assert flags["time"] == str(26 * 60) and flags["mem"] == "2G" and flags["constraint"] == "a100|h100"
    # procs_per_node: auto -> one process per GPU; the rendezvous is resolved inside the job.
    assert plan.payload.common.procs_per_node == 4
    assert '--master-addr "$DDPJOB_MASTER_ADDR" --master-port "$DDPJOB_MASTER_PORT"' in plan.render()
    env = plan.payload.common.env
    assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_DEBUG"] == "WARN"


def test_golden_array_sweep():
    plan = plan_of("jobs/sweep.yaml", ["slurm.array_parallelism=2", "slurm.partition=debug",
                                       "slurm.setup=[module load cuda/12.4, source /opt/env.sh]",
                                       "slurm.sbatch={mail-type: END, hold: true}"])
    text = plan.render()
    check_golden("slurm_array.txt", text)
    flags = sbatch_flags(plan.payload.script)
    assert flags["array"] == "0-3%2" and flags["mail-type"] == "END" and flags["hold"] is True
    assert flags["output"].endswith("/%A_%a_0_log.out")
    outs = [el.output_dir for el in plan.payload.elements]
    assert outs == [f"/home/u/.ddpjob/slurm/demo-abcde/output/sweep-{i}" for i in range(4)]
    assert [el.params for el in plan.payload.elements][1] == {"lr": "0.1", "seed": "2"}
    assert text.count("## task ") == 4 and "--lr 0.01 --seed 2" in text
    assert "# setup\nmodule load cuda/12.4\nsource /opt/env.sh\n" in plan.payload.script


def test_golden_pyxis_container():
    plan = plan_of("jobs/quickstart.yaml", ["slurm.container.runtime=pyxis", "slurm.container.mounts=[/data:/data:ro]",
                                            "image=nvcr.io#nvidia/pytorch:24.01-py3"])
    check_golden("slurm_pyxis.txt", plan.render())
    argv = srun_line(plan.payload.script)
    assert "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in argv
    assert "--container-mounts=/home/u/.ddpjob/slurm,/work/proj,/data:/data:ro" in argv
    # Inside the image, its own python runs submitit and torchrun.
    assert argv[argv.index("-u") - 1] == "python3"
    assert plan.payload.common.python == "python3"


def test_golden_apptainer_container():
    plan = plan_of("jobs/quickstart.yaml", ["slurm.container.runtime=apptainer", "slurm.container.image=/images/train.sif",
                                            "slurm.folder=/shared/ddpjob"])
    check_golden("slurm_apptainer.txt", plan.render())
    argv = srun_line(plan.payload.script)
    start = argv.index("apptainer")
    assert argv[start:start + 3] == ["apptainer", "exec", "--nv"]
    assert "/images/train.sif" in argv and argv[argv.index("/images/train.sif") + 1] == "python3"
    assert plan.payload.common.job_dir == "/shared/ddpjob/demo-abcde"


def test_container_needs_an_image():
    with pytest.raises(SpecError) as e:
        plan_of(base={"name": "demo", "command": ["python", "t.py"], "slurm": {"container": {"runtime": "pyxis"}}})
    assert "slurm.container.image" in e.value.render()


# --------------------------------------------------------------------------- hostile strings

def test_hostile_strings_never_reach_the_script_unquoted():
    plan = plan_of(base={
        "name": "demo", "nodes": 2, "procs_per_node": 1,
        "command": ["python", "train.py", "--note", *HOSTILE],
        "env": {"NOTE": "$(touch /tmp/pwned)", "QUOTE": "it's `id`"},
    }, sets=["slurm.sbatch={comment: \"$(touch /tmp/pwned); echo 'x'\"}"])
    script = plan.payload.script
    # Command and env never enter the sbatch script: they travel in submitit's pickle.
    body = "\n".join(ln for ln in script.splitlines() if not ln.startswith("#SBATCH --comment="))
    for word in HOSTILE[:3]:
        assert word not in body
    assert "#SBATCH --comment=" in script
    comment_line = next(ln for ln in script.splitlines() if ln.startswith("#SBATCH --comment="))
    assert shlex.split(comment_line.partition("=")[2]) == ["$(touch /tmp/pwned); echo 'x'"]
    # The rendered per-node line is a faithful shell rendering of the argv the runner executes.
    c, el = plan.payload.common, plan.payload.elements[0]
    text = plan.render()
    line = next(ln for ln in text.splitlines() if "torch.distributed.run" in ln)
    expected = node_argv(c, el, node="$SLURM_NODEID", addr="$DDPJOB_MASTER_ADDR", port="$DDPJOB_MASTER_PORT")
    assert shlex.split(line.strip().rstrip(")")) == expected
    # torchrun expands $-macros in worker arguments; "$" is doubled so the program gets HOSTILE as written.
    assert expected[-len(HOSTILE):] == [h.replace("$", "$$") for h in HOSTILE]
    env_lines = {ln.strip().rstrip(" \\").partition("=")[0]: ln.strip().rstrip(" \\").partition("=")[2]
                 for ln in text.splitlines() if ln.startswith("    ") and "=" in ln}
    assert shlex.split(env_lines["NOTE"]) == ["$(touch /tmp/pwned)"]
    assert shlex.split(env_lines["QUOTE"]) == ["it's `id`"]
    assert node_env(c, el, node="0")["NOTE"] == "$(touch /tmp/pwned)"


@pytest.mark.parametrize("override,field", [
    ('slurm.setup=["echo a\\nrm -rf ~"]', "slurm.setup"),
    ('slurm.sbatch={comment: "a\\nb"}', "slurm.sbatch"),
    ("slurm.sbatch={'--x; y': 1}", "slurm.sbatch"),
    ("slurm.sbatch={nodes: 3}", "slurm.sbatch"),
    ("slurm.sbatch={hold: false}", "slurm.sbatch"),
    ("slurm.folder='/tmp/a b'", "slurm.folder"),
    ("slurm.folder=/tmp/%j", "slurm.folder"),
    ("slurm.partition='debug;rm'", "slurm.partition"),
    ("slurm.time=1:2:3:4", "slurm.time"),
    ("slurm.time=abc", "slurm.time"),
    ("slurm.time=2:00:00", "slurm.time"),  # YAML reads it as 7200: refused with a hint to quote it
    ("slurm.memory=lots", "slurm.memory"),
    ("slurm.container.runtime=docker", "slurm.container.runtime"),
    ("slurm.container.mounts=['rel:/x']", "slurm.container.mounts"),
    ("slurm.container.image='a b'", "slurm.container.image"),
    ("slurm.signal_delay_s=1", "slurm.signal_delay_s"),
    ("slurm.partion=debug", "slurm.partion"),
])
def test_bad_slurm_options_are_refused(override, field):
    with pytest.raises(SpecError) as e:
        load_spec(REPO / "jobs/quickstart.yaml", overrides=[override])
    assert field in e.value.render()
    assert e.value.exit_code == 2


def test_cli_refuses_newline_in_setup_with_exit_2(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text('name: bad\ncommand: [python, t.py]\nslurm:\n  setup: ["module load x\\ntouch /tmp/pwned"]\n')
    proc = ddpjob_in_process("render", str(spec), "--target", "slurm")
    assert proc.returncode == 2
    assert "slurm.setup" in proc.stderr and "line break" in proc.stderr


@pytest.mark.parametrize("text,minutes", [
    ("30", 30), ("90:30", 91), ("1:00:00", 60), ("2-0", 2880), ("1-02:30", 1590), ("0-00:00:01", 1), ("1-2:3:4", 1564),
])
def test_time_formats(text, minutes):
    assert time_to_minutes(text) == minutes


@pytest.mark.parametrize("text", [
    # Issue 45, item 10: seconds / 60 of these overflowed a float (exit 70); int() of 5,000 digits is refused too.
    "1" * 2000, "1" * 400 + ":00:00", "1-" + "1" * 400, "9" * 5000, "4294967294", "2982617-00",
])
def test_times_past_what_slurm_holds_are_refused(text):
    with pytest.raises(ValueError):
        time_to_minutes(text)
    assert time_to_minutes("4294967293") == 4294967293


@pytest.mark.parametrize("field,value,words", [
    ("resources.memory", "1" * 2000 + "Gi", "has 2000 digits"), ("slurm.memory", "1" * 2000 + "G", "has 2000 digits"),
    ("slurm.time", "'" + "1" * 2000 + "'", "at most 4294967293 minutes"),
    ("slurm.time", "1" * 2000, "got the number 111111111111...111111111111 (2000 characters)"), ("stall.timeout", "1" * 2000, "(2000 characters) s"),
])
def test_huge_quantities_are_spec_errors_at_their_field(tmp_path, field, value, words):
    """Every target, in process, exit 2 with the field: never an internal error."""
    spec = tmp_path / "job.yaml"
    spec.write_text("name: big\nimage: img:1\ncommand: [python, t.py]\n")
    for target in ("local", "slurm", "k8s"):
        proc = ddpjob_in_process("render", str(spec), "--target", target, "--set", f"{field}={value}")
        assert proc.returncode == 2, proc.stderr
        assert f"{field}: " in proc.stderr and words in proc.stderr and len(proc.stderr) < 1000, proc.stderr


@pytest.mark.parametrize("dialect,quantity,slurm", [
    # resources.memory: Kubernetes quantities (G decimal, Gi binary), the same bytes on Slurm.
    ("quantity", "2Gi", "2G"), ("quantity", "512Mi", "512M"), ("quantity", "2G", "1908M"), ("quantity", "1.5Gi", "1536M"),
    ("quantity", "1Ti", "1T"), ("quantity", "1025Ki", "2M"), ("quantity", "1048576", "1M"), ("quantity", "64Ti", "64T"),
    # slurm.memory: sbatch --mem's own spelling (G binary, a bare number is megabytes).
    ("sbatch", "2G", "2G"), ("sbatch", "2Gi", "2G"), ("sbatch", "1000", "1000M"), ("sbatch", "4096K", "4M"),
])
def test_memory_conversion(dialect, quantity, slurm):
    assert slurm_mem(parse_memory(quantity, dialect)) == slurm


@pytest.mark.parametrize("dialect,quantity,words", [
    ("quantity", "1P", "more memory than any node"), ("quantity", "65Ti", "more memory"), ("quantity", "1000", "bare number is bytes"),
    ("quantity", "2GB", "memory size such as"), ("quantity", "-1Gi", "memory size such as"), ("sbatch", "2Pi", "memory size such as"),
    ("sbatch", "0", "less than 1Mi"), ("quantity", "1e9", "memory size such as"),
    # Issue 45, item 10: 2,000 digits were a float's infinity and ceil() an OverflowError (exit 70).
    ("quantity", "1" * 2000 + "Gi", "has 2000 digits"), ("sbatch", "1" * 2000 + "G", "has 2000 digits"),
    ("quantity", "1." + "1" * 5000 + "Gi", "characters. has 5001 digits"),
    ("quantity", "9" * 40 + "Gi", "more memory than any node"),
])
def test_memory_refused(dialect, quantity, words):
    from launcher.core.quantity import QuantityError

    with pytest.raises(QuantityError, match=words):
        parse_memory(quantity, dialect)


@pytest.mark.parametrize("field", ["resources.memory", "slurm.memory", "resources.shm"])
def test_bad_memory_is_a_spec_error_with_its_field(field):
    """One quantity parser for spec and Slurm: 1P used to pass the spec and crash the Slurm render (exit 70)."""
    proc = ddpjob_in_process("render", "jobs/quickstart.yaml", "--target", "slurm", "--set", f"{field}=1P")
    assert proc.returncode == 2, proc.stderr
    assert f"--set {field}=1P: {field}: " in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- render == submit

@pytest.mark.parametrize("path,sets", [
    ("jobs/quickstart.yaml", ["nodes=1"]),
    ("jobs/quickstart.yaml", ["slurm.exclusive=true", "slurm.sbatch={comment: \"it's $(x)\", hold: true}"]),
    ("jobs/sweep.yaml", ["slurm.array_parallelism=3", "slurm.setup=[module load x]"]),
    ("jobs/sweep.yaml", ["slurm.container.runtime=pyxis"]),
    ("jobs/quickstart.yaml", ["slurm.container.runtime=apptainer", "resources.gpus=2", "slurm.qos=q"]),
])
def test_render_equals_submitit_sbatch_string(path, sets):
    """The rendered script is byte for byte what submitit's own _make_sbatch_string produces."""
    from submitit.slurm.slurm import _make_sbatch_string

    from launcher.targets.slurm.payload import submitit_command

    p = plan_of(path, sets).payload
    c = p.common
    expected = _make_sbatch_string(command=submitit_command(c.submit_python, c.job_dir), folder=c.job_dir,
                                   map_count=p.map_count, **p.executor_params)
    assert p.script == expected


def test_render_is_deterministic_and_needs_no_submitit():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from launcher.cli.main import cli\n"
        "r = CliRunner().invoke(cli, ['render', 'jobs/sweep.yaml', '--target', 'slurm'], catch_exceptions=False)\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'submitit' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
        "print(r.output)\n"
    )
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1]
    assert "#SBATCH --array=0-3%4" in outs[0]


# --------------------------------------------------------------------------- parsers

@pytest.mark.parametrize("native,state", [
    ("PENDING", JobState.PENDING), ("REQUEUED", JobState.PENDING), ("RUNNING", JobState.RUNNING),
    ("COMPLETING", JobState.RUNNING), ("COMPLETED", JobState.SUCCEEDED), ("CANCELLED by 0", JobState.CANCELLED),
    ("FAILED", JobState.FAILED), ("TIMEOUT", JobState.FAILED), ("OUT_OF_MEMORY", JobState.FAILED),
    ("NODE_FAIL", JobState.FAILED), ("PREEMPTED", JobState.FAILED), ("completed", JobState.SUCCEEDED),
    ("SOMETHING_NEW", JobState.UNKNOWN), ("", JobState.UNKNOWN),
])
def test_state_table(native, state):
    assert map_state(native) == state


def test_state_table_covers_every_value_once():
    assert all(isinstance(v, JobState) for v in SLURM_STATES.values())
    assert JobState.UNKNOWN not in SLURM_STATES.values()


@pytest.mark.parametrize("text,hosts", [
    ("n1", ["n1"]), ("n[1-2]", ["n1", "n2"]), ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
    ("a[1,3]b", ["a1b", "a3b"]), ("", []),
])
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


def test_expand_job_id():
    assert expand_job_id("12_[2-4%2]") == ["12_2", "12_3", "12_4"]
    assert expand_job_id("12_[1,5]") == ["12_1", "12_5"]
    assert expand_job_id("12_3") == ["12_3"] and expand_job_id("12") == ["12"]


def test_parse_sacct_squeue_scontrol():
    sacct = "40|COMPLETED|0:0|n[1-2]|None\n41_0|RUNNING|0:0|n[1-2]|None\n41_[1-3%2]|PENDING|0:0|None assigned|JobArrayTaskLimit\n"
    recs = parse_sacct(sacct)
    assert recs["40"].state == "COMPLETED" and recs["41_0"].nodes == "n[1-2]"
    assert [recs[f"41_{i}"].state for i in (1, 2, 3)] == ["PENDING"] * 3
    squeue = "42|CANCELLED|n[1-2]|None\n43_1|PENDING||Resources\n"
    sq = parse_squeue(squeue)
    assert sq["42"].state == "CANCELLED" and sq["43_1"].reason == "Resources"
    scontrol = ("JobId=45 ArrayJobId=44 ArrayTaskId=1 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 NodeList=n[1-2]\n"
                "JobId=44 ArrayJobId=44 ArrayTaskId=2-3%2 JobState=PENDING Reason=JobArrayTaskLimit NodeList=(null)\n"
                "JobId=46 JobName=y JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=n1\n")
    sc = parse_scontrol(scontrol)
    assert sc["44_1"].state == "RUNNING" and sc["44_2"].state == "PENDING" and sc["44_3"].reason == "JobArrayTaskLimit"
    assert sc["46"].state == "CANCELLED" and sc["46"].exit_code == "0:15" and sc["44_2"].nodes == ""


def _probe(env: dict[str, str]) -> int:
    from launcher.targets.slurm.payload import PORT_SETUP

    out = subprocess.run(["bash", "-c", "\n".join(PORT_SETUP) + '\necho "$DDPJOB_MASTER_PORT"'],
                         env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_sbatch_script_finds_a_free_port_on_the_first_node():
    """The port is chosen inside the job, on the rendezvous host: a port another program holds is
    skipped, torchrun's default 29500 is never used, array elements start apart."""
    import socket

    start = _probe({"SLURM_JOB_ID": "1234"})
    assert start == 21234
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", start))
        squatter.listen()
        assert _probe({"SLURM_JOB_ID": "1234"}) == start + 1
    assert _probe({"SLURM_JOB_ID": "9500"}) == 29501
    elements = {_probe({"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": str(i), "SLURM_JOB_ID": str(80 + i)})
                for i in range(4)}
    assert len(elements) == 4


def test_a_fixed_master_port_needs_no_search():
    plan = plan_of("jobs/quickstart.yaml", ["master_port=31000"])
    assert "DDPJOB_MASTER_PORT=$(" not in plan.payload.script and "DDPJOB_MASTER_PORT  31000" in plan.render()


def test_array_elements_sacct_does_not_list_are_asked_of_the_controller(tmp_path, monkeypatch):
    """Just after ``scancel 123_1``, sacct may list element 1 (CANCELLED) and not yet element 0:
    squeue must be asked for the array, or element 0 shows as UNKNOWN. Stand-in Slurm commands
    here; the real cluster runs the same path in tests/slurm/test_slurm_target.py."""
    calls = tmp_path / "calls"
    for name, answer in {"sacct": "123_1|CANCELLED|0:15|n2|None", "squeue": "123_0|RUNNING|n1|None"}.items():
        cmd = tmp_path / name
        cmd.write_text(f"#!/bin/sh\necho {name} >> {calls}\necho '{answer}'\n")
        cmd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    records = query(["123"], elements={"123": 2})
    assert {k: r.state for k, r in records.items()} == {"123_0": "RUNNING", "123_1": "CANCELLED"}
    # A finished array that sacct lists whole needs no controller (it may be down).
    (tmp_path / "sacct").write_text(f"#!/bin/sh\necho sacct >> {calls}\nprintf '123_0|COMPLETED|0:0|n1|None\\n123_1|CANCELLED|0:15|n2|None\\n'\n")
    calls.unlink()
    assert {k: r.state for k, r in query(["123"], elements={"123": 2}).items()} == {"123_0": "COMPLETED", "123_1": "CANCELLED"}
    assert calls.read_text().split() == ["sacct"]
