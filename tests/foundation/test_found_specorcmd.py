"""Issue 23 (items 1, 5 and 8): what the user typed decides spec or command, big numbers and odd API
values are spec errors, and the smaller edges (job names, --set blame, rm's state). Every refusal
through the real command line exits 2 with the thing named, no traceback, nothing recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.core.errors import JobNotFound, SpecError, UsageError
from tests.foundation.test_found_hostile import no_jobs, refused, run_here
from tests.foundation.test_found_hostile import run as run_process
from tests.testkit import ddpjob_in_process, wait_for

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "jobs" / "quickstart.yaml"
BIG_HEX = "0x" + "f" * 4000          # 16,000 bits: Python writes no decimal of it
BIG_BIN = "0b" + "1" * 15_000
BIG_B60 = "1" + ":59" * 3000          # YAML 1.1 base 60


def test_a_file_not_named_yaml_is_still_a_spec_and_never_a_command(tmp_path, ddpjob_home):
    upper = tmp_path / "spec.YAML"
    upper.write_text(QUICK.read_text())
    assert refused(run_here("render", str(upper), "--set", "nodes=0")).startswith("--set nodes=0: nodes:")
    proc = run_here("validate", str(upper))
    assert proc.returncode == 0 and f"{upper}: ok (2 node(s)" in proc.stdout
    assert "/etc/passwd:1:1: the spec must be a mapping of fields, not a str" in refused(run_here("validate", "/etc/passwd"))
    for args in (["submit", str(tmp_path)], ["render", str(tmp_path)], ["submit", str(tmp_path), "--dry-run"]):
        assert f"{tmp_path}: not a regular file (a directory)" in refused(run_here(*args))
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    err = refused(run_here("submit", str(script)))
    assert f"{script}:1:1: the spec must be a mapping" in err and f"-- python {script}" in err
    piped = subprocess.run([sys.executable, "-m", "launcher", "submit", "/dev/stdin"], input=QUICK.read_text(),
                           capture_output=True, text=True, cwd=REPO)
    assert "/dev/stdin: not a regular file (a FIFO)" in refused(piped) and "give -" in piped.stderr
    err = refused(run_here("submit", "python", "train.py"))
    assert "put -- before it: ddpjob submit [OPTIONS] -- python train.py" in err
    assert "give one of them" in refused(run_here("submit", str(QUICK), "--", "python", "train.py"))
    assert "or a command after --" in refused(run_here("submit", "--"))
    no_jobs(ddpjob_home)


def test_dash_reads_the_spec_from_standard_input(ddpjob_home, cli_process):
    """Once through a real pipe into a ddpjob process, then in this process (the ``cli`` fixture's runner
    with the text as its standard input)."""
    assert cli_process("validate", "-", input=QUICK.read_text()).stdout == "-: ok (2 node(s), 1 task(s))\n"
    assert "# ddpjob local plan: job quickstart-xxxxx" in ddpjob_in_process("render", "-", input=QUICK.read_text()).stdout
    bad = ddpjob_in_process("submit", "-", input=QUICK.read_text().replace("nodes: 2", "nodes: 0"))
    assert "<stdin>:9:1: nodes: Input should be greater than or equal to 1" in refused(bad)
    raw = ddpjob_in_process("validate", "-", input=b"name: \xff\n")
    assert raw.returncode == 2 and "<stdin>:1:7: not UTF-8 text (byte 0xff)" in raw.stderr, raw.stderr
    no_jobs(ddpjob_home)


def test_the_documented_command_form_still_runs_the_command(tmp_path):
    proc = run_here("submit", "--dry-run", "--nodes", "2", "--", "python", "train.py", "--lr", "0.1", cwd=tmp_path)
    assert proc.returncode == 0 and "job train-xxxxx" in proc.stdout and "train.py --lr 0.1" in proc.stdout


@pytest.mark.parametrize(("command", "name"), [
    (["./multinode.py", "5", "1"], "multinode"), (["python", "-X", "dev", "train.py"], "train"),
    (["python3", "-u", "-W", "ignore", "sub/fit.py", "3"], "fit"), (["python", "-m", "launcher.train"], "launcher"),
    (["bash", "run.sh"], "run"), (["python", "-c", "pass"], "python"),
])
def test_a_command_only_job_is_named_after_its_script(command, name):
    proc = run_here("submit", "--dry-run", "--no-preflight", "--", *command)
    assert proc.returncode == 0 and f"job {name}-xxxxx" in proc.stdout.splitlines()[0], proc.stdout[:300] + proc.stderr


@pytest.mark.parametrize("field", ["nodes", "name", "env.A", "command"])
@pytest.mark.parametrize("number", [BIG_HEX, BIG_BIN, BIG_B60])
def test_numbers_too_long_to_write_are_spec_errors_at_their_line(tmp_path, ddpjob_home, field, number):
    lines = {"name": "name: a", "command": "command: [python, x.py]"}
    if field == "env.A":
        lines["env"] = f"env:\n  A: {number}"
    elif field == "command":
        lines["command"] = f"command: [python, {number}]"
    else:
        lines[field] = f"{field}: {number}"
    spec = tmp_path / "big.yaml"
    spec.write_text("\n".join(lines.values()) + "\n")
    where = {"nodes": ":3:1: nodes", "name": ":1:1: name", "env.A": ":4:3: env.A", "command": ":2:19: command[1]"}[field]
    assert f"{spec}{where}: a number of more than 4,300 digits" in refused(run_here("validate", str(spec)))
    err = refused(run_here("submit", "--set", f"{field}={number}", "--", "python", "x.py"))
    assert f": {field}: a number of more than 4,300 digits" in err
    no_jobs(ddpjob_home)


def test_counts_cpus_and_gpus_have_upper_bounds(tmp_path, ddpjob_home):
    for args in (["logs", "some-id", "--tail", "100000000000000000000"], ["list", "--limit", "100000000000000000000"]):
        assert "is not in the range 0<=x<=1000000000" in refused(run_here(*args))
    err = refused(run_here("submit", "--dry-run", "--set", "resources.cpus=100000", "--", "python", "x.py"))
    assert "resources.cpus: Input should be less than or equal to 4096" in err
    err = refused(run_here("submit", "--dry-run", "--set", "resources.gpus=100000", "--", "python", "x.py"))
    assert "resources.gpus: Input should be less than or equal to 1024" in err
    with pytest.raises(UsageError, match="--limit a number that large"):
        api.list_jobs(limit=10**20)
    no_jobs(ddpjob_home)


def test_a_workdir_that_is_missing_or_a_file_is_refused_at_its_line(tmp_path, ddpjob_home):
    (tmp_path / "x.py").write_text("print(1)\n")
    (tmp_path / "afile").write_text("")
    spec = tmp_path / "w.yaml"
    for workdir, what in (("nowhere", "does not exist"), ("afile", "is a file, not a directory")):
        spec.write_text(f"name: w\ncommand: [python, x.py]\nworkdir: {workdir}\n")
        for target in ("local", "slurm"):
            err = refused(run_here("submit", str(spec), "--target", target, cwd=tmp_path))
            assert f"{spec}:3:1: workdir: the working directory {tmp_path / workdir} {what}" in err
    # relative, to the folder it runs in: a long value is shortened in the message (pytest-xdist's folders are longer)
    err = refused(run_here("submit", "--set", "workdir=afile", "--", "python", "x.py", cwd=tmp_path))
    assert "--set workdir=afile: workdir: the working directory" in err, err
    no_jobs(ddpjob_home)


def test_an_error_a_set_causes_names_the_set_not_the_first_line(tmp_path):
    spec = tmp_path / "k.yaml"
    spec.write_text("name: a\nimage: i:1\ncommand: [python, x.py]\n")
    err = refused(run_here("render", str(spec), "-t", "k8s", "--set", "k8s.elastic.max_nodes=1"))
    assert err.startswith("--set k8s.elastic.max_nodes=1: k8s.elastic.min_nodes: required field is missing"), err
    assert f"{spec}:1:1" not in err


def test_the_api_refuses_bytes_big_numbers_and_odd_ids_with_typed_errors(ddpjob_home):
    for kwargs, words in (
        ({"command": [b"python", b"x.py"]}, "command[0]: bytes, not text"),
        ({"command": b"python x.py"}, "give the command as a list of strings, not a bytes"),
        ({"command": "python x.py"}, "give the command as a list of strings, not a str"),
        ({"command": ["python", "x.py"], "nodes": 10**5000}, "nodes: a number of more than 4,300 digits"),
        ({"command": ["python", "x.py"], "overrides": {"env.A": 10**5000}}, "env.A: a number of more than 4,300"),
        ({"command": ["python", "x.py"], "overrides": {"env.A": b"x"}}, "env.A: a bytes is not a spec value"),
        ({"spec": {"name": "a", "command": ["python", 1 << 20_000]}}, "command[1]: a number of more than 4,300"),
    ):
        with pytest.raises(SpecError, match=words.replace("[", r"\[").replace("]", r"\]")):
            api.submit(**kwargs)
    for job_id in (None, 5, b"x"):
        with pytest.raises(JobNotFound, match="a job id is a string"):
            api.get(job_id)  # type: ignore[arg-type]
    assert api.list_jobs() == []


@pytest.mark.real
def test_rm_names_the_state_a_running_job_is_in(tmp_path, ddpjob_home):
    (tmp_path / "sleep.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    job_id = run_process("submit", "-q", "--", "python", "sleep.py", cwd=tmp_path, limit_as=None).stdout.strip()
    try:
        wait_for(lambda: "up" in run_process("logs", job_id, limit_as=None).stdout, "the job to run")
        err = refused(run_process("rm", job_id, limit_as=None))
        assert f"{job_id} is RUNNING: cancel it first" in err, err
    finally:
        run_process("cancel", job_id, limit_as=None)
    assert json.loads(run_process("status", job_id, "-o", "json", limit_as=None).stdout)["state"] == "CANCELLED"


@pytest.mark.parametrize("name", ["\x00", "a\x00b.yaml", "\x1b[31mred.yaml"])
def test_a_spec_name_with_control_characters_is_refused_and_shown_escaped(name):
    """A NUL byte in a file name used to be an internal error (exit 70: os.stat's ValueError); an
    escape sequence reached the terminal as is."""
    from click.testing import CliRunner

    from launcher.cli.main import cli as root

    result = CliRunner().invoke(root, ["validate", name])
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "\x00" not in result.output and "\x1b" not in result.output
    assert ("not a file name: it holds a NUL byte" if "\x00" in name else "file not found") in result.output


def test_dry_run_before_the_spec_takes_no_value_from_it(ddpjob_home):
    """`--dry-run`'s value is optional (client, server): `submit --dry-run SPEC` is a client dry run of
    SPEC, not the mode 'SPEC'."""
    for args in (["--dry-run", str(QUICK)], ["--dry-run", "client", str(QUICK)], [str(QUICK), "--dry-run"]):
        proc = run_here("submit", *args, "--target", "local")
        assert proc.returncode == 0 and "# ddpjob local plan: job quickstart-xxxxx" in proc.stdout, (args, proc.stderr)
    err = refused(run_here("submit", "--dry-run=spec.yaml", str(QUICK)))
    assert "'spec.yaml' is not one of 'client', 'server'" in err
    no_jobs(ddpjob_home)
