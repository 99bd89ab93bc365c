"""The job spec: every broken spec exits 2 with file:line and field path, no traceback, nothing recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.core.errors import SpecError
from launcher.spec.load import allowed_keys, load_spec
from launcher.spec.model import json_schema, sanitize_name
from launcher.spec.sweep import expand, substitute

HERE = Path(__file__).parent
BROKEN = HERE / "broken"

# file -> (line, field path, words the message or hint must contain)
CORPUS = {
    "unknown_key.yaml": (3, "colour", "unknown field 'colour'"),
    "typo_key.yaml": (3, "nodse", "did you mean 'nodes'?"),
    "wrong_type.yaml": (4, "resources.cpus", "valid integer"),
    "zero_nodes.yaml": (3, "nodes", "greater than or equal to 1"),
    "bad_name.yaml": (1, "name", "for example name: my-job"),
    "dup_sweep.yaml": (4, "sweep.lr", "listed twice"),
    "yaml_syntax.yaml": (None, None, "YAML syntax error"),  # None: the whole file, no field named
    "hostile_env.yaml": (4, "env.X; rm -rf ~", "not a valid variable name"),
    "hostile_command.yaml": (2, "command[1]", "line break"),
    "reserved_env.yaml": (4, "env.WORLD_SIZE", "cannot be set"),
    "unknown_placeholder.yaml": (2, "command[3]", "placeholder {learning_rate}"),
    "missing.yaml": (None, None, "file not found"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_broken_spec_exits_2_with_location(name: str, cli, ddpjob_home: Path) -> None:
    line, field, words = CORPUS[name]
    path = BROKEN / name
    for verb in (["validate", str(path)], ["submit", str(path), "--target", "local"]):
        proc = cli(*verb)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        prefix = f"{path}:{line}:" if line else f"{path}"
        matching = [ln for ln in proc.stderr.splitlines() if ln.startswith(prefix)
                    and (f": {field}: " in ln if field else "<root>" not in ln and words in ln)]
        assert matching, f"no line starting {prefix!r} naming {field!r} in:\n{proc.stderr}"
        assert words in proc.stderr
        # validate submits nothing in any case (issue 45 item 7: it said "nothing was submitted").
        said = "nothing was submitted" in proc.stderr
        assert said if verb[0] == "submit" else (not said and " found.\n" in proc.stderr), proc.stderr
    # Nothing recorded: the registry has no job (or does not even exist).
    listing = cli("list", "-o", "json")
    assert listing.returncode == 0
    assert json.loads(listing.stdout) == []
    assert not (ddpjob_home / "runs").exists()


def test_all_errors_reported_at_once(tmp_path: Path) -> None:
    spec = tmp_path / "many.yaml"
    spec.write_text("name: Bad\ncomand: [x]\nnodes: 0\nresources:\n  memmory: 1Gi\n")
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    text = info.value.render()
    assert f"{spec}:1:1: name:" in text
    assert f"{spec}:2:1: comand: unknown field 'comand'" in text and "did you mean 'command'?" in text
    assert f"{spec}:3:1: nodes:" in text
    assert f"{spec}:5:3: resources.memmory:" in text and "did you mean 'memory'?" in text
    assert "command: required field is missing" in text
    assert "5 problems found" in text


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    spec = tmp_path / "dup.yaml"
    spec.write_text("name: a\ncommand: [x]\nnodes: 1\nnodes: 2\n")
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert f"{spec}:4:1: nodes: duplicate key 'nodes' (first on line 3)" in info.value.render()


def test_overrides_apply_before_validation_and_name_their_source(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: a\ncommand: [python, t.py]\nnodes: 1\n")
    loaded = load_spec(spec, overrides=["nodes=3", "resources.cpus=4", "env.SEED=7", "procs_per_node=auto"])
    assert loaded.spec.nodes == 3 and loaded.spec.resources.cpus == 4 and loaded.spec.env == {"SEED": "7"}
    with pytest.raises(SpecError) as info:
        load_spec(spec, overrides=["nodes=0"])
    assert "--set nodes=0: nodes: Input should be greater than or equal to 1" in info.value.render()
    with pytest.raises(SpecError) as info:
        load_spec(spec, overrides=["novalue"])
    assert "expected KEY=VALUE" in info.value.render()


def test_sweep_expands_to_the_cartesian_product() -> None:
    loaded = load_spec(None, base={
        "name": "s", "command": ["python", "t.py", "--lr", "{lr}", "--seed", "{seed}", "--out", "{output_dir}"],
        "env": {"TAG": "run-{sweep_index}-{job_id}"}, "sweep": {"lr": [0.1, 0.01], "seed": [1, 2]},
    })
    els = expand(loaded.spec, job_id="s-abcde", output_root="/out")
    assert [e.params for e in els] == [
        {"lr": "0.1", "seed": "1"}, {"lr": "0.1", "seed": "2"}, {"lr": "0.01", "seed": "1"}, {"lr": "0.01", "seed": "2"}]
    assert els[3].command == ["python", "t.py", "--lr", "0.01", "--seed", "2", "--out", "/out/sweep-3"]
    assert els[3].env == {"TAG": "run-3-s-abcde"}
    assert [e.output_dir for e in els] == [f"/out/sweep-{i}" for i in range(4)]
    single = expand(load_spec(None, base={"name": "s", "command": ["x"]}).spec, job_id="j", output_root="/out")
    assert len(single) == 1 and single[0].output_dir == "/out"


def test_substitute_never_evaluates() -> None:
    assert substitute("{{lr}} {lr}", {"lr": "0.1"}) == "{lr} 0.1"
    assert substitute("$(whoami) `id` ;", {}) == "$(whoami) `id` ;"
    with pytest.raises(SpecError) as info:
        load_spec(None, base={"name": "s", "command": ["x", "{lr.__class__}"], "sweep": {"lr": [1]}})
    assert "placeholder" in info.value.render()


def test_typo_suggestions_reach_nested_sections() -> None:
    assert "memory" in allowed_keys(("resources",))
    assert "debug" in allowed_keys(("nccl",))
    assert "stop_on_failure" in allowed_keys(("local",))
    assert allowed_keys(("env",)) == []


def test_relative_workdir_is_taken_from_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    spec = tmp_path / "sub" / "s.yaml"
    spec.write_text("name: a\ncommand: [x]\nworkdir: ../code\n")
    assert load_spec(spec).spec.workdir == str(tmp_path / "code")


@pytest.mark.parametrize("raw,expected", [("My_Job", "my-job"), ("9lives", "job-9lives"), ("a" * 60, "a" * 40), ("--", "job")])
def test_sanitize_name(raw: str, expected: str) -> None:
    assert sanitize_name(raw) == expected


def test_schema_command_prints_json_schema_with_descriptions(cli) -> None:
    proc = cli("schema")
    assert proc.returncode == 0
    schema = json.loads(proc.stdout)
    props = schema["properties"]
    assert {"name", "command", "nodes", "procs_per_node", "sweep", "local", "slurm", "k8s"} <= set(props)
    assert schema.get("additionalProperties") is False
    missing = [k for k, v in props.items() if "description" not in v]
    assert missing == []
    assert json_schema()["title"] == "ddpjob job spec"


def test_example_jobs_validate(cli) -> None:
    jobs = sorted(str(p) for p in (Path(__file__).parents[2] / "jobs").glob("*.yaml"))
    assert len(jobs) >= 4
    proc = cli("validate", *jobs)
    assert proc.returncode == 0, proc.stderr
    assert len(re.findall(r": ok \(", proc.stdout)) == len(jobs)


def test_every_field_of_every_section_is_described():
    schema = json_schema()
    undocumented = []

    def walk(node, where):
        for name, prop in node.get("properties", {}).items():
            if "description" not in prop:
                undocumented.append(f"{where}.{name}")
    walk(schema, "spec")
    for name, definition in schema.get("$defs", {}).items():
        walk(definition, name)
    assert undocumented == []


def test_output_dir_may_name_the_job_id():
    loaded = load_spec(None, base={"name": "s", "command": ["x", "{lr}"], "sweep": {"lr": [1, 2]},
                                   "output_dir": "/shared/{job_id}"})
    els = expand(loaded.spec, job_id="s-abcde", output_root=loaded.spec.output_dir)
    assert [e.output_dir for e in els] == ["/shared/s-abcde/sweep-0", "/shared/s-abcde/sweep-1"]
    with pytest.raises(SpecError) as info:
        load_spec(None, base={"name": "s", "command": ["x"], "output_dir": "/o/{lr}"})
    assert "output_dir: placeholder {lr} cannot be used here" in info.value.render()


def test_two_specs_never_share_a_default_list_or_mapping() -> None:
    """Empty lists and mappings are plain defaults (pydantic copies them for each spec): filling
    one spec's must leave the next spec's empty."""
    from launcher.spec.model import spec_model

    first, second = (spec_model().model_validate({"name": n, "command": ["python", "t.py"]}) for n in ("a", "b"))
    first.env["X"] = "1"
    first.k8s.labels["team"] = "ml"
    first.k8s.tolerations.append(None)
    first.slurm.setup.append("module load cuda")
    assert (second.env, second.k8s.labels, second.k8s.tolerations, second.slurm.setup) == ({}, {}, [], [])
