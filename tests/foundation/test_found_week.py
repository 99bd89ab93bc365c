"""A user's week (issue 25) on the local target: rerun, the queue view, Ctrl-C words, the pip user's
path. Real local jobs through the real command line in a subprocess."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from pathlib import Path

import pytest
from testkit import run_in_pty, wait_for

REPO = Path(__file__).resolve().parents[2]

SHOW_ENV = """\
import os
print("token-ok" if os.environ.get("API_TOKEN") == "from-the-file" else "token-wrong",
      "other-ok" if os.environ.get("OTHER_SECRET") == "given-on-the-line" else "other-wrong",
      "host=" + os.environ.get("HOST_TOKEN", "-").upper(),  # upper-cased: logs mask the value itself
      "seed=" + os.environ.get("SEED", "-"), "rank=" + os.environ["RANK"], flush=True)
"""


def _spec(folder: Path) -> Path:
    (folder / "show_env.py").write_text(SHOW_ENV)
    spec = folder / "week.yaml"
    spec.write_text("name: week\ncommand: [python, show_env.py]\nnodes: 2\n"
                    "env: {API_TOKEN: from-the-file, SEED: '1'}\nenv_from_host: [HOST_TOKEN]\n")
    return spec


@pytest.mark.real
def test_rerun_submits_the_recorded_spec_again_with_secrets_from_their_sources(cli, tmp_path, ddpjob_home):
    project = tmp_path / "project"
    project.mkdir()
    spec = _spec(project)
    first = cli("submit", "-q", "week.yaml", "--set", "env.OTHER_SECRET=given-on-the-line", cwd=project, check=True,
                env={"HOST_TOKEN": "shell-1"})
    first_id = first.stdout.strip()
    assert cli("wait", first_id, "--timeout", "120").returncode == 0

    # From another folder, with an override: the job runs from where it was submitted (show_env.py
    # is relative), the file's secret is read again, the command line's must be given again.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused = cli("rerun", first_id, "--set", "env.SEED=2", cwd=elsewhere)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "env.OTHER_SECRET" in refused.stderr and f"ddpjob rerun {first_id} --set env.OTHER_SECRET=" in refused.stderr
    assert "env.API_TOKEN" not in refused.stderr and "given-on-the-line" not in refused.stderr
    assert len(json.loads(cli("list", "-o", "json", check=True).stdout)) == 1  # nothing submitted

    again = ("rerun", first_id, "--set", "env.SEED=2", "--set", "env.OTHER_SECRET=given-on-the-line", "-f")
    no_host = cli(*again, cwd=elsewhere)
    # env_from_host is read from the shell that reruns, as at submit: here the shell has none.
    assert "HOST_TOKEN" not in os.environ
    assert no_host.returncode == 2 and "HOST_TOKEN" in no_host.stderr, no_host.stdout + no_host.stderr
    proc = cli(*again, cwd=elsewhere, timeout=180, env={"HOST_TOKEN": "shell-2"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[node1 rank1] token-ok other-ok host=SHELL-2 seed=2 rank=1" in proc.stdout, proc.stdout
    assert f"Rerunning {first_id} with env.SEED=2, env.OTHER_SECRET=***" in proc.stdout
    listed = json.loads(cli("list", "-o", "json", check=True).stdout)
    second_id = listed[0]["id"]
    assert listed[0]["rerun_of"] == first_id and listed[1]["rerun_of"] is None
    data = json.loads(cli("status", second_id, "-o", "json", check=True).stdout)
    assert data["rerun_of"] == first_id and data["spec"]["env"]["SEED"] == "2"
    assert f"rerun of: {first_id}" in cli("status", second_id, check=True).stdout
    # A rerun of a rerun finds the file's secret again; the line's still has to be given.
    third = cli("rerun", second_id, "--set", "env.OTHER_SECRET=given-on-the-line", "--nodes", "1", "-q", "-f",
                cwd=elsewhere, timeout=180, env={"HOST_TOKEN": "shell-3"})
    assert third.returncode == 0 and "token-ok other-ok host=SHELL-3 seed=2 rank=0" in third.stdout, \
        third.stdout + third.stderr

    # No value of a secret is in the registry.
    with sqlite3.connect(ddpjob_home / "registry.db") as db:
        dump = "\n".join(db.iterdump())
    assert "from-the-file" not in dump and "given-on-the-line" not in dump and "shell-" not in dump

    # The file changed: its secret is gone, so the rerun says where it looked and how to give it.
    spec.write_text(spec.read_text().replace("API_TOKEN: from-the-file, ", ""))
    gone = cli("rerun", first_id, "--set", "env.OTHER_SECRET=x", cwd=elsewhere, env={"HOST_TOKEN": "shell-4"})
    assert gone.returncode == 2 and f"it came from {spec}, which no longer holds it" in gone.stderr, gone.stderr


def test_rerun_of_an_unknown_job_is_exit_4_and_help_has_an_example(cli):
    proc = cli("rerun", "nosuch-abcde")
    assert proc.returncode == 4 and "nosuch-abcde" in proc.stderr
    helped = cli("rerun", "--help", check=True).stdout
    assert "ddpjob rerun ID --set env.SEED=2" in helped and "rerun_of" in helped


# --------------------------------------------------------------------------- the queue view

def _listed(cli, *args: str) -> list[dict]:
    return json.loads(cli("list", "-o", "json", *args, check=True).stdout)


@pytest.mark.real
def test_list_shows_age_duration_and_a_sweeps_runs_and_filters(cli, tmp_path):
    sweep = cli("submit", "-q", "--name", "sweep-a", "--set", "sweep={s: [0, 300, 301]}", "--",
                "python", "-c", "import time; time.sleep({s})", cwd=tmp_path, check=True).stdout.strip()
    other = cli("submit", "-q", "--name", "other", "--", "python", "-c", "pass", cwd=tmp_path, check=True).stdout.strip()
    assert cli("wait", other, "--timeout", "120").returncode == 0
    # The sweep's first run has ended, its second runs: runs 1/3 in the table and in json.
    wait_for(lambda: "runs 1/3" in cli("list", check=True).stdout, "the sweep to show runs 1/3")
    table = cli("list", check=True).stdout.splitlines()
    assert table[0].split()[:6] == ["ID", "TARGET", "STATE", "NODES", "AGE", "DURATION"], table
    row = next(line for line in table if line.startswith(sweep))
    assert re.search(rf"^{sweep}\s+local\s+RUNNING\s+1\s+\d+[smh]\S*\s+\d+[smh]\S*\s+runs 1/3", row), row
    (entry,) = _listed(cli, "--name", "sweep-*")
    assert entry["id"] == sweep and entry["runs_done"] == 1 and entry["runs"] == 3
    assert entry["age_s"] >= entry["duration_s"] >= 0
    done = _listed(cli, "--state", "succeeded")
    assert [j["id"] for j in done] == [other] and done[0]["runs_done"] == 1 and done[0]["duration_s"] > 0
    assert [j["id"] for j in _listed(cli, "--state", "RUNNING", "--state", "pending")] == [sweep]
    assert _listed(cli, "--target", "slurm") == [] and "no job matches" in cli("list", "--name", "x*").stdout
    assert cli("list", "--state", "nosuch").returncode == 2
    assert cli("cancel", sweep).returncode == 0


@pytest.mark.real
def test_cancel_several_asks_on_a_terminal_and_needs_yes_elsewhere(cli, tmp_path):
    ids = [cli("submit", "-q", "--name", f"q{i}", "--", "python", "-c", "import time; time.sleep(300)", cwd=tmp_path,
               check=True).stdout.strip() for i in range(3)]
    refused = cli("cancel", ids[0], ids[1])
    assert refused.returncode == 2 and "add --yes" in refused.stderr and "nothing was cancelled" in refused.stderr
    assert cli("cancel", ids[0], "nosuch-xyzab", "--yes").returncode == 4  # an unknown id: nothing cancelled
    assert all(j["state"] in ("RUNNING", "PENDING") for j in _listed(cli))
    assert cli("cancel", "--state", "running", ids[0]).returncode == 2  # filters go with --all

    argv = [sys.executable, "-m", "launcher", "cancel", "--all", "--name", "q[01]"]
    code, out = run_in_pty(argv, cwd=REPO, env=dict(os.environ), answers=(("Cancel them?", "n\n"),))
    assert code == 1 and "These 2 jobs will be cancelled:" in out and "Nothing was cancelled." in out, out
    assert ids[0] in out and ids[1] in out and ids[2] not in out
    assert all(j["state"] != "CANCELLED" for j in _listed(cli))
    code, out = run_in_pty(argv, cwd=REPO, env=dict(os.environ), answers=(("Cancel them?", "y\n"),))
    assert code == 0 and f"{ids[0]}: CANCELLED" in out and f"{ids[1]}: CANCELLED" in out, out
    states = {j["id"]: j["state"] for j in _listed(cli)}
    assert states[ids[0]] == states[ids[1]] == "CANCELLED" and states[ids[2]] != "CANCELLED"
    assert cli("cancel", "--all", "--yes", check=True).stdout.strip() == f"{ids[2]}: CANCELLED"
    assert "nothing to cancel" in cli("cancel", "--all", check=True).stdout


@pytest.mark.real
def test_logs_tail_is_per_node(cli, tmp_path):
    job = cli("submit", "-q", "--nodes", "2", "--", "python", "-c", "for i in range(5): print('line', i)",
              cwd=tmp_path, check=True).stdout.strip()
    assert cli("wait", job, "--timeout", "120").returncode == 0
    lines = cli("logs", job, "--tail", "1", check=True).stdout.splitlines()
    assert sorted(lines) == ["[node0 rank0] line 4", "[node1 rank1] line 4"], lines
    assert cli("logs", job, "--tail", "2", "--node", "1", check=True).stdout.splitlines() == \
        ["[node1 rank1] line 3", "[node1 rank1] line 4"]
    assert "the last N lines of each node" in cli("logs", "--help", check=True).stdout


# --------------------------------------------------------------------------- Ctrl-C words

def _ddpjob(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *args]


@pytest.mark.real
def test_ctrl_c_on_submit_follow_and_wait_says_how_to_follow_and_cancel(cli, tmp_path):
    sleeper = ["--", "python", "-c", "import time; print('started', flush=True); time.sleep(300)"]
    code, out = run_in_pty(_ddpjob("submit", "-f", *sleeper), cwd=tmp_path, env=dict(os.environ),
                           answers=(("started", "\x03"),))
    job = re.search(r"Submitted (\S+) to local", out).group(1)  # type: ignore[union-attr]
    assert code == 130, out
    assert f"Ctrl-C: stopped following; {job} keeps running." in out
    for line in (f"follow:  ddpjob logs {job} -f", f"status:  ddpjob status {job}", f"cancel:  ddpjob cancel {job}"):
        assert line in out, out
    assert "Traceback" not in out and _listed(cli)[0]["state"] == "RUNNING"

    # wait on a terminal shows a live line; Ctrl-C leaves the job running and says how to come back.
    code, out = run_in_pty(_ddpjob("wait", job), env=dict(os.environ), answers=((f"{job}: RUNNING", "\x03"),))
    assert code == 130 and f"Ctrl-C: stopped waiting; {job} keeps running." in out, out
    assert f"wait:    ddpjob wait {job}" in out and f"cancel:  ddpjob cancel {job}" in out
    assert _listed(cli)[0]["state"] == "RUNNING"
    assert cli("cancel", job).returncode == 0


@pytest.mark.real
def test_ctrl_c_on_doctor_then_its_report_again_says_ok_iterations_and_loopback(cli, tmp_path):
    code, out = run_in_pty(_ddpjob("doctor", "--nodes", "2", "--max-mib", "4", "--iters", "7"), cwd=tmp_path,
                           env=dict(os.environ), answers=(("waiting for it...", "\x03"),))
    job = re.search(r"doctor: job (\S+) on local", out).group(1)  # type: ignore[union-attr]
    assert code == 130 and f"Ctrl-C: stopped waiting; {job} keeps running." in out, out
    assert f"report:  ddpjob doctor --report {job}" in out
    proc = cli("doctor", "--report", job, "-o", "json", timeout=300)  # waits for the job, then reports
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["verdict"] == [] and report["job_id"] == job
    assert [r["iters"] for r in report["results"]] == [7, 7]
    assert report["bandwidth_verdict"].startswith("does not apply: the ranks reach each other over loopback")
    assert any("busbw = algbw" in n and "2 ranks" in n for n in report["notes"])
    text = cli("doctor", "--report", job[:-1], check=True).stdout  # a prefix of the id, as everywhere
    assert "verdict: ok: the ranks agree on their settings" in text and "bandwidth: does not apply" in text
    assert re.search(r"^\s+4Mi\s+7\s", text, re.M) and "note: with 2 ranks busbw = algbw" in text, text
    assert len(_listed(cli)) == 1  # --report ran nothing new


# --------------------------------------------------------------------------- the pip user's path

def _commands(group, prefix=()):
    import click

    yield prefix, group
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            yield from _commands(command, (*prefix, name))


def test_no_help_text_sends_a_pip_user_to_a_jobs_folder_they_do_not_have():
    from click.testing import CliRunner

    from launcher.cli.main import cli as ddpjob_cli

    seen = []
    for path, _ in _commands(ddpjob_cli):
        result = CliRunner().invoke(ddpjob_cli, [*path, "--help"], catch_exceptions=False)
        assert result.exit_code == 0, (path, result.output)
        assert "jobs/" not in result.output, (path, result.output)
        seen.append(" ".join(path))
    assert {"rerun", "list", "cancel", "doctor", "init", "submit"} <= set(seen)
    # The quickstart that init writes, the API example (docs/commands.md) and the API's own docstring.
    from launcher import api
    from launcher.spec import examples

    assert "jobs/" not in examples.text("quickstart") and "ddpjob submit quickstart.yaml" in examples.text("quickstart")
    readme = (REPO / "docs" / "commands.md").read_text()
    api_example = readme.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "jobs/" not in api_example and 'api.submit("quickstart.yaml"' in api_example
    assert "jobs/" not in (api.__doc__ or "")


def test_completion_offers_inits_example_names(cli):
    env = {"COMP_WORDS": "ddpjob init ", "COMP_CWORD": "2", "_DDPJOB_COMPLETE": "bash_complete"}
    out = cli(env=env, check=True).stdout
    assert [line.split(",", 1)[1] for line in out.splitlines()] == ["quickstart", "cifar", "linreg", "sweep"]
    env.update(COMP_WORDS="ddpjob init sw", _DDPJOB_COMPLETE="zsh_complete")
    out = cli(env=env, check=True).stdout
    assert out.splitlines()[:2] == ["plain", "sweep"] and "grid" in out


def _report(addresses: list[str], world: int) -> dict:
    ranks = [{"rank": i, "host": f"h{i}", "address": a, "env": {}} for i, a in enumerate(addresses)]
    results = [{"bytes": 2**20, "iters": 3, "time_us": 10.0, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]
    return {"world_size": world, "ranks": ranks, "results": results}


def test_doctor_says_when_the_bandwidth_verdict_does_not_apply_and_why_busbw_equals_algbw():
    from launcher.doctor.run import bandwidth_verdict, notes, render

    loop = _report(["127.0.0.1", "127.0.0.1"], 2)
    assert bandwidth_verdict(loop).startswith("does not apply: the ranks reach each other over loopback (127.0.0.1)")
    assert notes(loop) and "busbw = algbw" in notes(loop)[0]
    apart = _report(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], 4)
    assert bandwidth_verdict(apart).startswith("not judged: best busbw 1.00 GB/s") and notes(apart) == []
    text = "\n".join(render({**loop, "bandwidth_verdict": bandwidth_verdict(loop), "notes": notes(loop)}, []))
    assert "verdict: ok: the ranks agree on their settings" in text and "bandwidth: does not apply" in text
    assert "bandwidth measured at every size" not in text and re.search(r"^\s+1Mi\s+3\s", text, re.M), text


# --------------------------------------------------------------------------- colour on a terminal

ESC = "\x1b["


@pytest.mark.real
def test_colour_on_a_terminal_plain_when_piped_or_no_color(cli, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env["TERM"] = "xterm"
    code, out = run_in_pty(_ddpjob("submit", "--nodes", "2", "-f", "--", "python", "-c", "print('hi')"),
                           cwd=tmp_path, env=env)
    assert code == 0, out
    job = re.search(r"Submitted (\S+) to local", out).group(1)  # type: ignore[union-attr]
    # Each rank's prefix in its own colour, the state by its meaning.
    assert f"{ESC}36m[node0 rank0]{ESC}0m hi" in out and f"{ESC}33m[node1 rank1]{ESC}0m hi" in out, repr(out)
    assert f"{job}: {ESC}32mSUCCEEDED{ESC}0m" in out
    code, out = run_in_pty(_ddpjob("logs", job), env=env)
    assert f"{ESC}33m[node1 rank1]{ESC}0m hi" in out, repr(out)
    code, out = run_in_pty(_ddpjob("list"), env=env)
    assert re.search(rf"^{job}\s+local\s+{re.escape(ESC)}32mSUCCEEDED\s*{re.escape(ESC)}0m", out, re.M), repr(out)
    code, out = run_in_pty(_ddpjob("status", job), env=env)
    assert f"state:    {ESC}32mSUCCEEDED{ESC}0m" in out, repr(out)
    # NO_COLOR on a terminal, and any pipe: plain text.
    for args, shown in ((("logs", job), "[node1 rank1] hi"), (("list",), job), (("status", job), "SUCCEEDED")):
        code, out = run_in_pty(_ddpjob(*args), env={**env, "NO_COLOR": "1"})
        assert code == 0 and ESC not in out and shown in out, repr(out)
        piped = cli(*args, env={"TERM": "xterm"}, check=True)
        assert ESC not in piped.stdout + piped.stderr and shown in piped.stdout
    assert "[node1 rank1] hi" in cli("logs", job, check=True).stdout
