"""No error, hint or plan sent to a cluster holds the value of a secret-named variable: YAML's own
words about an alias (``*x``), a tag (``!x``) or broken quoting are replaced by ddpjob's, which
never quote the text, in a spec file and in ``--set`` alike; Kubernetes refuses such a value in
``env:`` (it would travel as plain ``value:`` in the job's object) and points at ``k8s.env_refs``."""

from __future__ import annotations

import pytest

from launcher.core.errors import SpecError
from launcher.spec.load import load_spec

SECRET = "Hunter2pw"
# Values YAML reads as something else than the text written; each once made the text show up.
VALUES = [f"*{SECRET}", f"!{SECRET}", f"!!python/name:{SECRET}", f"!<tag:{SECRET}> x", f"!{SECRET}!x y",
          f"!!float {SECRET}", f"!!int {SECRET}", f"[*{SECRET}]", f"{{a: !{SECRET}}}", f'"{SECRET}\\q"',
          f'"{{{SECRET}}}"', f"'{SECRET}", f"@{SECRET}", f"!!binary {SECRET}"]


def _problem(**kwargs: object) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(**kwargs)  # type: ignore[arg-type]
    return str(info.value)


@pytest.mark.parametrize("value", VALUES)
def test_a_secret_value_is_never_quoted_in_a_spec_files_errors(tmp_path, value):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\ncommand: [python, x.py]\nenv:\n  SEED: 1\n  DB_PASSWORD: {value}\n")
    text = _problem(path=str(spec))
    assert SECRET not in text and SECRET.lower() not in text, text
    assert f"{spec}:5:" in text or f"{spec}:6:" in text, text  # still at its line


@pytest.mark.parametrize("value", VALUES)
def test_a_secret_value_is_never_quoted_in_a_sets_errors(value):
    base = {"name": "s", "command": ["python", "x.py"]}
    for override in (f"env.DB_PASSWORD={value}", f"env={{DB_PASSWORD: {value}}}"):
        try:
            loaded = load_spec(None, base=base, overrides=[override])
        except SpecError as e:
            assert SECRET not in str(e) and SECRET.lower() not in str(e), str(e)
        else:  # text YAML cannot read at all is taken as the string written
            assert SECRET in loaded.spec.env["DB_PASSWORD"]


def test_the_words_for_other_values_still_name_the_alias_and_tag(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ncommand: [python, x.py]\nenv: {SEED: *seed, MODE: !fast x}\n")
    text = _problem(path=str(spec))
    assert "alias *seed refers to no anchor" in text and "define &seed earlier" in text


def test_the_cli_shows_no_secret_and_says_how_to_quote(cli):
    proc = cli("submit", "--dry-run", "--set", f"env.DB_PASSWORD=*{SECRET}", "--", "python", "x.py")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr and "env.DB_PASSWORD" in proc.stderr
    assert "quote the value" in proc.stderr


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_k8s_refuses_a_secret_named_env_value_and_points_at_env_refs(cli, tmp_path, api):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nimage: img:1\ncommand: [python, x.py]\n"
                    f"env: {{SEED: '7', DB_PASSWORD: {SECRET}}}\n")
    for args in (["render", str(spec)], ["submit", str(spec), "--dry-run"]):
        proc = cli(*args, "-t", "k8s", "--set", f"k8s.api={api}")
        assert proc.returncode == 2, proc.stderr
        assert SECRET not in proc.stdout + proc.stderr
        assert f"{spec}:4:" in proc.stderr and "env.DB_PASSWORD" in proc.stderr and "k8s.env_refs" in proc.stderr
    ok = cli("render", str(spec), "-t", "k8s", "--set", f"k8s.api={api}", "--set", "env={SEED: '7'}",
             "--set", "k8s.env_refs.DB_PASSWORD={secret: db, key: password}")
    assert ok.returncode == 0 and "secretKeyRef" in ok.stdout, ok.stderr
