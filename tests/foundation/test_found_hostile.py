"""Hostile and broken input, through the real command line: each case is refused with exit 2 (4 for
an id, 3 for an unusable home) and a located message, at once, in bounded memory, changing nothing.

Input that could cost time or memory (alias bombs, FIFOs and devices, huge or deep files, huge
sweeps, tags) goes to a ``ddpjob`` process of its own under a 2 GB limit and a timeout (``run``);
ordinary values out of range and an unusable home, which cost nothing, to ``ddpjob`` in the test's
process (``run_here``)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.core.errors import EXIT_CODES
from launcher.service.registry import Registry

REPO = Path(__file__).resolve().parents[2]
TWO_GB = 2 << 30


# A refusal "at once" is one whose process ends within this many seconds (subprocess's timeout:
# a run past it is killed and fails the test). Reading a FIFO or /dev/zero, expanding an alias bomb
# or planning 3,200,000 runs would not end in it; the refusals take well under a second.
AT_ONCE_S = 10


def run(*args: str, limit_as: int | None = TWO_GB, timeout: float = 30, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``ddpjob`` under an address-space limit, killed (failing the test) after ``timeout`` s."""
    def limits() -> None:
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd or REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limits, env={**os.environ, **(env or {})})


def run_here(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The same ``ddpjob`` run in this process (tests/testkit.py ``ddpjob_in_process``): for refusals
    whose subject is the message and the exit code, not the process's limits."""
    from testkit import ddpjob_in_process

    return ddpjob_in_process(*args, env=env, cwd=cwd)


def refused(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout and "internal error" not in proc.stderr
    return proc.stderr


def no_jobs(ddpjob_home: Path) -> None:
    assert json.loads(run_here("list", "-o", "json").stdout) == []
    assert not (ddpjob_home / "runs").exists()


def bomb(depth: int) -> str:
    lines = ["name: bomb", "command: [python, x.py]", 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("depth", [7, 8, 9])
def test_alias_bomb_is_refused_within_10s_under_2gb(tmp_path, ddpjob_home, depth):
    spec = tmp_path / "bomb.yaml"
    spec.write_text(bomb(depth))
    assert len(spec.read_bytes()) < 1000
    for verb in (["validate"], ["submit", "--target", "local"]):
        err = refused(run(*verb, str(spec), timeout=AT_ONCE_S))
        assert f"{spec}:" in err and "once its aliases (*name) are expanded" in err
    no_jobs(ddpjob_home)


def test_fifo_device_and_directory_are_refused_at_once(tmp_path, ddpjob_home):
    fifo = tmp_path / "x.yaml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    for path, kind in ((fifo, "a FIFO"), (zero, "a character device"), (folder, "a directory")):
        assert f"not a regular file ({kind})" in refused(run("validate", str(path), timeout=AT_ONCE_S))
    assert "not a regular file" in refused(run("submit", str(fifo), timeout=AT_ONCE_S))
    no_jobs(ddpjob_home)


def test_size_cap_nesting_long_values_and_sweep_cap(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: " + "a" * 5_000_000 + "\ncommand: [python, x.py]\n")
    assert "larger than 1,048,576 bytes" in refused(run("validate", str(big), timeout=AT_ONCE_S))
    proc = run("validate", str(big), env={"DDPJOB_SPEC_MAX_BYTES": "6000000"})
    assert "at most 65,536 are allowed" in refused(proc)  # the cap is configurable: now the value is read

    deep = tmp_path / "deep.yaml"
    deep.write_text("name: d\ncommand: [python, x.py]\nenv: " + "[" * 50_000 + "]" * 50_000 + "\n")
    err = refused(run("validate", str(deep), timeout=AT_ONCE_S))
    assert f"{deep}:3:" in err and "nested more than 64 levels" in err

    sweep = tmp_path / "sweep.yaml"
    values = "[" + ", ".join(str(i) for i in range(20)) + "]"
    sweep.write_text("name: s\ncommand: [python, x.py, '{a}{b}{c}{d}{e}']\nsweep:\n"
                     + "".join(f"  {k}: {values}\n" for k in "abcde"))
    for verb in (["validate"], ["render", "--target", "slurm"]):
        proc = run(*verb, str(sweep), timeout=AT_ONCE_S)
        assert f"{sweep}:3:1: sweep: the sweep makes 3,200,000 tasks" in refused(proc)


def test_yaml_tags_and_complex_keys_are_spec_errors_and_nothing_runs(tmp_path, ddpjob_home):
    marker = tmp_path / "PWNED"
    tagged = tmp_path / "tag.yaml"
    tagged.write_text(f"name: t\ncommand: [python, x.py]\nenv:\n  A: !!python/object/apply:os.system ['touch {marker}']\n")
    proc = run("submit", str(tagged))
    err = refused(proc)
    assert f"{tagged}:4:6: env.A: YAML tag !!python/object/apply:os.system is not allowed" in err
    assert not marker.exists()
    complex_key = tmp_path / "complex.yaml"
    complex_key.write_text("name: t\ncommand: [python, x.py]\n? [a, b]\n: c\n")
    assert f"{complex_key}:3:3:" in refused(run("validate", str(complex_key)))
    huge_int = tmp_path / "int.yaml"
    huge_int.write_text("name: t\ncommand: [python, x.py]\nnodes: 1" + "0" * 5000 + "\n")
    assert f"{huge_int}:3:8:" in refused(run("validate", str(huge_int)))
    no_jobs(ddpjob_home)


def test_numbers_and_options_out_of_range(tmp_path, ddpjob_home):
    for value in ("0", "-3"):
        spec = tmp_path / f"ppn{value}.yaml"
        spec.write_text(f"name: p\nimage: img:1\ncommand: [python, x.py]\nprocs_per_node: {value}\n")
        for target in ("local", "slurm", "k8s"):
            err = refused(run_here("render", str(spec), "--target", target))
            assert f"{spec}:4:1: procs_per_node: Input should be greater than or equal to 1" in err
    for args in (["-p", "-1"], ["-p", "0"], ["--nodes", "-1"]):
        refused(run_here("submit", *args, "--", "python", "x.py"))
    err = refused(run_here("submit", "--set", "env.T=a\nb", "--", "python", "x.py"))
    assert "--set env.T=a\\nb: env.T: the value contains a line break" in err
    assert "control character '\\x1b'" in refused(run_here("submit", "--set", "env.T=\x1b[2J", "--", "python", "x.py"))
    for bad in ("nan", "inf", "-1"):
        assert "--timeout" in refused(run_here("wait", "some-id", "--timeout", bad))
    for opt in ("--tail", "--node", "--rank", "--task"):
        refused(run_here("logs", "some-id", opt, "-5"))
    no_jobs(ddpjob_home)


def test_an_empty_id_never_matches_and_an_ambiguous_prefix_lists_the_candidates(ddpjob_home):
    reg = Registry(ddpjob_home)
    ids = [reg.reserve("abc", "local", {"name": "abc", "nodes": 1})[0]]
    for blank in ("", " ", "\t"):  # with one job, "" was a prefix of its id and cancelled it
        assert "an empty job id matches no job" in refused(run_here("cancel", blank), 4)
    assert reg.get(ids[0]).state.value == "PENDING"
    ids.append(reg.reserve("abc", "local", {"name": "abc", "nodes": 1})[0])
    err = refused(run_here("cancel", "abc-"), 4)
    assert "is the start of several job ids" in err and all(i in err for i in ids)
    assert [reg.get(i).state.value for i in ids] == ["PENDING", "PENDING"]  # nothing was cancelled
    proc = run_here("status", ids[0][:-1], "-o", "json")  # a unique prefix still finds its job
    assert proc.returncode == 0 and json.loads(proc.stdout)["id"] == ids[0]
    bad = refused(run_here("wait", ids[0], "--timeout", "nan"))
    assert "--timeout nan" in bad and reg.get(ids[0]).state.value == "PENDING"


@pytest.mark.real
def test_logs_outside_the_job_exit_2_and_a_closed_pipe_exits_0(tmp_path, ddpjob_home):
    (tmp_path / "many.py").write_text("for i in range(20000):\n    print('line', i)\n")
    shell = (f"{sys.executable} -m launcher submit -f --nodes 2 -- python many.py | head -1; "
             "echo rc=${PIPESTATUS[0]}")
    out = subprocess.run(["bash", "-c", shell], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.stdout.startswith("Submitted ") and out.stdout.rstrip().endswith("rc=0"), out.stdout + out.stderr
    job_id = out.stdout.split()[1]
    assert run("wait", job_id, "--timeout", "200", limit_as=None, timeout=240).returncode == 0
    piped = subprocess.run(["bash", "-c", f"{sys.executable} -m launcher logs {job_id} | head -1; "
                            "echo rc=${PIPESTATUS[0]}"], capture_output=True, text=True, timeout=60)
    assert piped.stdout.splitlines() == ["[node0 rank0] line 0", "rc=0"], piped.stdout + piped.stderr
    assert "Broken pipe" not in piped.stderr and "Exception ignored" not in piped.stderr
    for args, words in ((["--node", "2"], "--node 2: {} has 2 nodes (valid: 0..1)"),
                        (["--rank", "999"], "--rank 999: {} has 2 ranks (valid: 0..1)"),
                        (["--task", "99"], "--task 99: {} has 1 run (valid: 0..0)")):
        assert words.format(job_id) in refused(run("logs", job_id, *args))
    assert "--task 1: " in refused(run("cancel", job_id, "--task", "1"))
    # torchrun's agent may add its own last lines (a "connection reset" when node 0's store goes
    # first at shutdown): --tail is checked against the whole log, the worker's end separately.
    whole = run("logs", job_id, "--node", "1").stdout.splitlines()
    tail = run("logs", job_id, "--node", "1", "--tail", "2")
    assert tail.returncode == 0 and tail.stdout.splitlines() == whole[-2:], tail.stdout
    assert [ln for ln in whole if ln.startswith("[node1 rank1]")][-2:] == ["[node1 rank1] line 19998",
                                                                         "[node1 rank1] line 19999"]


def _mount_tmpfs(where: Path, options: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_an_unusable_home_is_exit_3_with_the_path_and_the_cause(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    (tmp_path / "x.py").write_text("print(1)\n")
    cases = [(blocker / "home", "Not a directory")]
    mounts = []
    if os.geteuid() == 0 and _mount_tmpfs(tmp_path / "ro", "ro,size=1m"):
        mounts.append(tmp_path / "ro")
        cases.append((tmp_path / "ro" / "home", "Read-only file system"))
    if os.geteuid() == 0 and _mount_tmpfs(tmp_path / "full", "size=64k"):
        mounts.append(tmp_path / "full")
        with open(tmp_path / "full" / "fill", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        cases.append((tmp_path / "full" / "home", "disk"))  # SQLite: "database or disk is full", "disk I/O error"
    try:
        for home, cause in cases:
            for args in (["list"], ["submit", "--", "python", "x.py"], ["status", "x"]):
                err = refused(run_here(*args, env={"DDPJOB_HOME": str(home)}, cwd=tmp_path), 3)
                assert f"cannot use {home} ($DDPJOB_HOME" in err and cause in err, err
    finally:
        for m in mounts:
            subprocess.run(["umount", str(m)], capture_output=True)
    if len(cases) < 3:
        pytest.skip("read-only and full filesystems need root (mount -t tmpfs); only the file-in-path case ran")


def test_every_exit_code_is_in_help_and_the_commands_page():
    help_text = run("--help").stdout
    readme = (REPO / "docs" / "commands.md").read_text()
    for code in EXIT_CODES:
        assert f"\n    {code:<5}" in help_text, code
        assert f"\n| {code} | " in readme, code
