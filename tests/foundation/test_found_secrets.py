"""Secrets at rest and on screen: a real local job receives a secret ``env`` value and an
``env_from_host`` value; no command prints them, the registry and plan.txt hold neither, the
host's value is written nowhere by ddpjob, and nothing under $DDPJOB_HOME is open to others."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import stat
from pathlib import Path

import pytest

from launcher.service.registry import Registry

REPORT = '''
import hashlib, json, os
digest = lambda k: hashlib.sha256(os.environ.get(k, "<unset>").encode()).hexdigest()
with open(os.path.join(os.environ["DDPJOB_OUTPUT_DIR"], "seen-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({k: digest(k) for k in ("API_TOKEN", "HOST_SECRET", "PLAIN", "OMP_NUM_THREADS")}, f)
print("rank", os.environ["RANK"], "done", flush=True)
'''


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def every_file(root: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(root) for f in files]


@pytest.mark.real
def test_a_job_gets_its_secrets_and_nothing_shows_or_stores_them(cli, tmp_path, ddpjob_home):
    token, host_value = f"tok-{secrets.token_hex(8)}", f"host-{secrets.token_hex(8)}"
    (tmp_path / "report.py").write_text(REPORT)
    env = {"HOST_SECRET": host_value, "OMP_NUM_THREADS": "3"}  # the shell's value wins over ddpjob's default
    args = ["--nodes", "2", "--set", f"env.API_TOKEN={token}", "--set", "env.PLAIN=visible",
            "--set", "env_from_host=[HOST_SECRET, OMP_NUM_THREADS]", "--", "python", "report.py"]
    dry = cli("submit", "--dry-run", *args, cwd=tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr
    assert token not in dry.stdout and host_value not in dry.stdout
    assert "API_TOKEN='***'" in dry.stdout and "PLAIN=visible" in dry.stdout
    assert "# env_from_host: HOST_SECRET, OMP_NUM_THREADS" in dry.stdout and "OMP_NUM_THREADS=" not in dry.stdout

    job_id = cli("submit", "-q", *args, cwd=tmp_path, env=env, check=True).stdout.strip()
    assert cli("wait", job_id, "--timeout", "180").returncode == 0
    run_dir = ddpjob_home / "runs" / job_id
    for rank in (0, 1):  # the processes received both values
        seen = json.loads((run_dir / "output" / f"seen-{rank}.json").read_text())
        assert seen == {"API_TOKEN": sha(token), "HOST_SECRET": sha(host_value), "PLAIN": sha("visible"),
                        "OMP_NUM_THREADS": sha("3")}

    shown = [cli("status", job_id, "-o", "json"), cli("status", job_id), cli("list", "-o", "json"), cli("list"),
             cli("logs", job_id)]
    for proc in shown:
        assert proc.returncode == 0, proc.stderr
        assert token not in proc.stdout + proc.stderr and host_value not in proc.stdout + proc.stderr
    assert json.loads(shown[0].stdout)["spec"]["env"] == {"API_TOKEN": "***", "PLAIN": "visible"}

    with sqlite3.connect(ddpjob_home / "registry.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(FULL)")
    for path in every_file(ddpjob_home):  # neither value: in no file ddpjob wrote (plan.json included)
        assert host_value.encode() not in path.read_bytes(), path
        assert token.encode() not in path.read_bytes(), path
    assert json.loads((run_dir / "plan.json").read_text())["elements"][0]["nodes"][1]["env"]["API_TOKEN"] == "***"
    assert token not in (run_dir / "plan.txt").read_text() and "API_TOKEN='***'" in (run_dir / "plan.txt").read_text()

    for path in [ddpjob_home, *(Path(d) / n for d, dirs, files in os.walk(ddpjob_home) for n in dirs + files)]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


def test_env_from_host_is_refused_where_it_cannot_be_honoured(cli, tmp_path, ddpjob_home):
    (tmp_path / "x.py").write_text("print(1)\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: hosty\nimage: img:1\ncommand: [python, x.py]\nenv_from_host: [HOST_ONLY_TOKEN]\n")
    k8s = cli("render", str(spec), "--target", "k8s")
    assert k8s.returncode == 2 and f"{spec}:4:1: env_from_host: the k8s target cannot take values" in k8s.stderr
    assert "k8s.env_refs" in k8s.stderr
    env = {k: v for k, v in os.environ.items() if k != "HOST_ONLY_TOKEN"}
    missing = cli("submit", str(spec), "--target", "local", env=env, cwd=tmp_path)
    assert missing.returncode == 2 and "HOST_ONLY_TOKEN is not set in this shell" in missing.stderr
    assert json.loads(cli("list", "-o", "json").stdout) == []
    slurm = cli("render", str(spec), "--target", "slurm")
    assert slurm.returncode == 0 and "# env_from_host: HOST_ONLY_TOKEN" in slurm.stdout
    for names, words in (("[A_TOKEN]", "env_from_host: A_TOKEN is also set in env:"),
                         ("[B, B]", "env_from_host: B is listed twice"),
                         ("[WORLD_SIZE]", "env_from_host[0]: WORLD_SIZE is set for each process")):
        both = tmp_path / "both.yaml"
        both.write_text(f"name: b\ncommand: [python, x.py]\nenv: {{A_TOKEN: x}}\nenv_from_host: {names}\n")
        proc = cli("validate", str(both))
        assert proc.returncode == 2 and f"{both}:4:" in proc.stderr and words in proc.stderr, proc.stderr


@pytest.mark.parametrize("target", ["local", "slurm"])  # k8s refuses them: test_found_secret_errors
def test_render_masks_secret_names_and_configured_patterns(cli, tmp_path, target):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nimage: img:1\ncommand: [python, x.py]\n"
                    "env: {DB_PASSWORD: pw-aaa, AWS_SECRET_ACCESS_KEY: sk-bbb, SSH_KEY: k-ccc, MY_CREDENTIALS: c-ddd,\n"
                    "      GH_PASSWD: p-eee, WANDB_THING: w-fff, SEED: '7'}\n")
    proc = cli("render", str(spec), "--target", target, env={"DDPJOB_SECRET_ENV": "wandb_*, OTHER"})
    assert proc.returncode == 0, proc.stderr
    for value in ("pw-aaa", "sk-bbb", "k-ccc", "c-ddd", "p-eee", "w-fff"):
        assert value not in proc.stdout, value
    assert proc.stdout.count("***") >= 6 and "7" in proc.stdout


def test_error_messages_and_older_records_never_show_a_secret(cli, ddpjob_home):
    proc = cli("submit", "--set", "env.API_TOKEN=abc-secret\nxyz", "--", "python", "x.py")
    assert proc.returncode == 2 and "abc-secret" not in proc.stderr and "env.API_TOKEN=***" in proc.stderr
    reg = Registry(ddpjob_home)
    job_id, _ = reg.reserve("old", "local", {"name": "old", "env": {}})
    with sqlite3.connect(reg.path) as conn:  # a record written before masking existed
        conn.execute("UPDATE jobs SET spec_json = ? WHERE id = ?",
                     (json.dumps({"name": "old", "env": {"MY_TOKEN": "plain-old-secret"}}), job_id))
    status = cli("status", job_id, "-o", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["spec"]["env"] == {"MY_TOKEN": "***"}
    for args in (["status", job_id], ["list", "-o", "json"], ["list"]):
        out = cli(*args)
        assert out.returncode == 0 and "plain-old-secret" not in out.stdout


def _count_plans(monkeypatch, target: str) -> list[str]:
    """The job ids the target's real ``plan`` is called with, from now on."""
    from launcher.targets.lookup import target_class

    cls = target_class(target)
    real, calls = cls.plan, []

    def plan(self, loaded, ctx):
        calls.append(ctx.job_id)
        return real(self, loaded, ctx)

    monkeypatch.setattr(cls, "plan", plan)
    return calls


SECRET_SPEC = "name: s\nimage: img:1\ncommand: [python, x.py]\nenv: {API_TOKEN: tok-123, PLAIN: visible}\n"


@pytest.mark.parametrize("target", ["local", "slurm"])
def test_a_plan_is_built_once_and_its_text_masks_the_payloads_secrets(monkeypatch, tmp_path, target):
    from launcher.service.jobs import Jobs
    from launcher.spec.load import load_spec
    from launcher.targets.shared.files import to_json

    (tmp_path / "s.yaml").write_text(SECRET_SPEC)
    calls = _count_plans(monkeypatch, target)
    plan = Jobs(Registry(tmp_path / "home")).plan(load_spec(str(tmp_path / "s.yaml")), target)
    assert calls == ["s-xxxxx"]  # render and --dry-run: one plan, its text rendered from it
    shown = plan.render()
    assert "tok-123" not in shown and "***" in shown and "visible" in shown
    assert "tok-123" in json.dumps(to_json(plan.payload))  # what is submitted keeps the value
    assert plan.render(masked=False) == shown.replace("'***'", "tok-123")  # the same text, unmasked


def test_submit_plans_once_hands_over_the_real_value_and_records_the_masked_text(monkeypatch, tmp_path):
    from launcher.service.jobs import Jobs
    from launcher.spec.load import load_spec
    from launcher.targets.slurm.payload import SlurmHandle
    from launcher.targets.slurm.target import SlurmTarget

    (tmp_path / "s.yaml").write_text(SECRET_SPEC)
    calls = _count_plans(monkeypatch, "slurm")
    handed = []
    # The one fake: no Slurm here; what submit receives is what it would hand to submitit.
    monkeypatch.setattr(SlurmTarget, "submit", lambda self, plan: handed.append(plan) or SlurmHandle(plan.job_id, plan.run_dir))
    done = Jobs(Registry(tmp_path / "home")).submit(load_spec(str(tmp_path / "s.yaml")), "slurm", preflight=False)
    assert calls == [done.job_id] and handed == [done.plan]
    assert {el.env.get("API_TOKEN") for el in done.plan.payload.elements} | {done.plan.payload.common.env.get("API_TOKEN")} >= {"tok-123"}
    assert "tok-123" not in done.plan.render() and "API_TOKEN='***'" in done.plan.render()


def test_a_plan_record_keeps_no_secret_value_in_any_env_mapping():
    from launcher.targets.shared.files import mask_env_values

    data = {"common": {"env": {"API_TOKEN": "t0k", "A": "1"}}, "elements": [{"env": {"API_TOKEN": "t1k"}, "n": 2}],
            "other": {"API_TOKEN": "kept: not an env mapping"}}
    assert mask_env_values(data, frozenset({"API_TOKEN"})) == {
        "common": {"env": {"API_TOKEN": "***", "A": "1"}}, "elements": [{"env": {"API_TOKEN": "***"}, "n": 2}],
        "other": {"API_TOKEN": "kept: not an env mapping"}}
