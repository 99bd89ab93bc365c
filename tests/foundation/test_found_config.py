"""Issue 25 item 6: defaults from a user config and a project file, ``--env-file`` and ``--env``.

Precedence flags > spec > project file > user config > built-in, on every target's plan (render is
exactly what submit hands over), ``ddpjob config show`` naming where each value comes from, errors
at the defaults file's line, and secrets from an env file reaching a real local job without being
shown or stored."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import pytest
import yaml

SPEC = "name: demo\ncommand: [python, train.py]\nslurm: {time: '2:00:00'}\n"


@pytest.fixture
def project(tmp_path: Path) -> dict[str, Path]:
    """A user config, a project folder with .ddpjob.yaml, and a spec in a subfolder of it."""
    user = tmp_path / "home-config.yaml"
    user.write_text("target: k8s\nimage: reg.example/team/train:1\nslurm: {partition: cpu, account: ml}\n"
                    "k8s: {namespace: team-ml, queue: team-q}\nenv: {FROM_USER: u}\n")
    root = tmp_path / "proj"
    (root / "sub").mkdir(parents=True)
    (root / ".ddpjob.yaml").write_text("target: slurm\nslurm: {partition: gpu}\nenv: {FROM_PROJECT: p, FROM_USER: p}\n")
    (root / "sub" / "job.yaml").write_text(SPEC)
    (root / "sub" / "train.py").write_text("print('hi')\n")
    return {"user": user, "root": root, "cwd": root / "sub", "spec": root / "sub" / "job.yaml"}


def env_for(files: dict[str, Path]) -> dict[str, str]:
    return {"DDPJOB_CONFIG": str(files["user"])}


def test_files_fill_what_the_spec_leaves_out_in_order_of_precedence(cli, project):
    run = lambda *a: cli(*a, cwd=project["cwd"], env=env_for(project))  # noqa: E731
    plan = run("render", "job.yaml")  # no --target: the project file's (slurm) over the user's (k8s)
    assert plan.returncode == 0, plan.stderr
    out = plan.stdout
    assert out.startswith("# ddpjob slurm plan")
    assert "#SBATCH --partition=gpu" in out and "#SBATCH --account=ml" in out  # project > user; user fills
    assert "#SBATCH --time=120" in out  # the spec's own value
    assert "FROM_PROJECT=p" in out and "FROM_USER=p" in out  # env merges key by key, project wins
    flags = run("render", "job.yaml", "--set", "slurm.partition=big", "--set", "slurm.time=5")
    assert "#SBATCH --partition=big" in flags.stdout and "#SBATCH --time=5" in flags.stdout  # flags > all
    k8s = run("render", "job.yaml", "--target", "k8s")
    assert k8s.returncode == 0, k8s.stderr
    job = next(doc for doc in yaml.safe_load_all(k8s.stdout) if doc)
    assert job["metadata"]["namespace"] == "team-ml"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    assert "image: reg.example/team/train:1" in k8s.stdout
    local = run("render", "job.yaml", "--target", "local")
    assert local.stdout.startswith("# ddpjob local plan") and "FROM_PROJECT=p" in local.stdout
    # DDPJOB_CONFIG=none: neither file, the built-in target (local) and nothing filled in
    bare = cli("render", "job.yaml", cwd=project["cwd"], env={"DDPJOB_CONFIG": "none"})
    assert bare.stdout.startswith("# ddpjob local plan") and "FROM_PROJECT" not in bare.stdout


def test_config_show_names_each_value_and_its_file_and_line(cli, project):
    (project["root"] / ".ddpjob.yaml").write_text(
        "target: slurm\nslurm: {partition: gpu, time: '9:00:00'}\nenv:\n  API_TOKEN: hunter2-xyz\n")
    show = cli("config", "show", "job.yaml", cwd=project["cwd"], env=env_for(project))
    assert show.returncode == 0, show.stderr
    lines = {line.split()[0]: line for line in show.stdout.splitlines()[4:] if line.strip()}
    project_file = project["root"] / ".ddpjob.yaml"
    assert lines["target"].split()[1] == "slurm" and f"project file {project_file}:1" in lines["target"]
    assert f"user config {project['user']}:3" in lines["slurm.account"]
    assert "gpu" in lines["slurm.partition"] and f"{project_file}:2" in lines["slurm.partition"]
    assert "the spec wins" in lines["slurm.time"] and "the spec wins" not in lines["slurm.partition"]
    assert "***" in lines["env.API_TOKEN"] and "hunter2" not in show.stdout
    data = json.loads(cli("config", "show", "-o", "json", cwd=project["cwd"], env=env_for(project)).stdout)
    by_key = {row["key"]: row for row in data["defaults"]}
    assert data["project_file"] == str(project_file) and data["user_config_found"] is True
    assert by_key["slurm.partition"]["hidden"] == [f"user config {project['user']}:3"]  # the lower value, not used
    assert by_key["image"]["value"] == "reg.example/team/train:1" and by_key["env.API_TOKEN"]["value"] == "***"
    none = cli("config", "show", cwd=project["cwd"], env={"DDPJOB_CONFIG": "none"})
    assert "no defaults set" in none.stdout


def test_a_defaults_file_value_the_spec_refuses_is_shown_at_that_files_line(cli, project):
    project["user"].write_text("nodes: 0\nslurm: {partiton: gpu}\nenv: {DB_PASSWORD: '*Hunter2pw'}\n")
    proc = cli("render", "job.yaml", "--target", "local", cwd=project["cwd"], env=env_for(project))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"user config {project['user']}:1: nodes: Input should be greater than or equal to 1" in proc.stderr
    assert f"user config {project['user']}:2: slurm.partiton: unknown field" in proc.stderr
    assert "Hunter2pw" not in proc.stderr
    project["user"].write_text("target: mars\n")
    proc = cli("render", "job.yaml", cwd=project["cwd"], env=env_for(project))
    assert proc.returncode == 2 and f"{project['user']}:1:1: target: 'mars' is not a target" in proc.stderr
    proc = cli("render", "job.yaml", cwd=project["cwd"], env={"DDPJOB_CONFIG": str(project["root"] / "nope.yaml")})
    assert proc.returncode == 2 and "no such file (named by DDPJOB_CONFIG)" in proc.stderr
    assert json.loads(cli("list", "-o", "json").stdout) == []


def test_env_file_and_env_flags_set_variables_over_the_spec(cli, tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "s.yaml").write_text("name: e\ncommand: [python, train.py]\nenv: {A: spec, B: spec}\n")
    (tmp_path / ".env").write_text("# comment\nexport A=file\nB='two words $HOME'\nC=\"say \\\"hi\\\"\" # note\n"
                                   "API_TOKEN=t0ps3cret\n")
    out = cli("render", "s.yaml", "--env-file", ".env", "--env", "B=flag=x", cwd=tmp_path).stdout
    assert "A=file" in out and "B=flag=x" in out and """C='say "hi"'""" in out
    assert "API_TOKEN='***'" in out and "t0ps3cret" not in out
    (tmp_path / "plain.env").write_text("A=file\n")
    k8s = cli("render", "s.yaml", "--target", "k8s", "--set", "image=img:1", "--env-file", "plain.env", cwd=tmp_path)
    assert k8s.returncode == 0 and "value: file" in k8s.stdout, k8s.stderr
    k8s = cli("render", "s.yaml", "--target", "k8s", "--set", "image=img:1", "--env-file", ".env", cwd=tmp_path)
    assert k8s.returncode == 2 and "--env-file .env:5: env.API_TOKEN: API_TOKEN looks secret" in k8s.stderr
    assert "t0ps3cret" not in k8s.stdout + k8s.stderr
    (tmp_path / "bad.env").write_text("OK=1\nnot a line\nD=\"open\nAPI_TOKEN='*x\n")
    bad = cli("render", "s.yaml", "--env-file", "bad.env", cwd=tmp_path)
    assert bad.returncode == 2 and "--env-file bad.env:2: env: expected NAME=value" in bad.stderr
    assert "--env-file bad.env:3: env.D: a quoted value is not closed" in bad.stderr
    assert "--env-file bad.env:4: env.API_TOKEN" in bad.stderr and "*x" not in bad.stderr
    for args, words in ((["--env", "9X=secret"], "--env 9X: env: expected --env NAME=value"),
                        (["--env-file", "missing.env"], "--env-file missing.env: env: file not found")):
        proc = cli("render", "s.yaml", *args, cwd=tmp_path)
        assert proc.returncode == 2 and words in proc.stderr and "secret" not in proc.stderr, proc.stderr


@pytest.mark.real
def test_a_local_job_gets_env_file_values_and_the_project_files_defaults(cli, tmp_path, ddpjob_home):
    token = f"tok-{secrets.token_hex(6)}"
    (tmp_path / ".ddpjob.yaml").write_text("target: local\nnodes: 2\nenv: {FROM_PROJECT: yes-p}\n")
    (tmp_path / "job.env").write_text(f"API_TOKEN={token}\n")
    (tmp_path / "seen.py").write_text(
        "import hashlib, json, os\n"
        "out = os.path.join(os.environ['DDPJOB_OUTPUT_DIR'], 'seen-%s.json' % os.environ['RANK'])\n"
        "json.dump({'token': hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest(),\n"
        "           'project': os.environ['FROM_PROJECT']}, open(out, 'w'))\n")
    env = {"DDPJOB_CONFIG": str(tmp_path / "no-user-config.yaml")}
    (tmp_path / "no-user-config.yaml").write_text("{}\n")
    job_id = cli("submit", "-q", "--env-file", "job.env", "--", "python", "seen.py", cwd=tmp_path, env=env,
                 check=True).stdout.strip()
    assert cli("wait", job_id, "--timeout", "180").returncode == 0
    run_dir = ddpjob_home / "runs" / job_id
    for rank in (0, 1):  # two nodes: from the project file
        seen = json.loads((run_dir / "output" / f"seen-{rank}.json").read_text())
        assert seen == {"token": hashlib.sha256(token.encode()).hexdigest(), "project": "yes-p"}
    status = json.loads(cli("status", job_id, "-o", "json").stdout)
    assert status["spec"]["env"]["API_TOKEN"] == "***" and status["spec"]["nodes"] == 2
    for folder, _, files in os.walk(ddpjob_home):
        for name in files:
            assert token.encode() not in (Path(folder) / name).read_bytes(), name
