"""Fuzzing the front door: mutated specs and command lines, run through the real click commands
in-process (fast enough for a few hundred cases). Every case ends with exit 0 or 2 (4 for a job id:
the registry is empty), never a traceback or an "internal error", and without growing the process's
memory by more than 300 MB (a case that hangs is stopped by pytest-timeout). Nothing is submitted:
``submit`` runs ``--dry-run``."""

from __future__ import annotations

import os
import resource
import tempfile
from pathlib import Path

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from launcher.cli.main import cli

BASE = {
    "name": "fuzz", "image": "img:1", "command": ["python", "train.py", "--lr", "{lr}"], "nodes": 2,
    "procs_per_node": 1, "resources": {"cpus": 2, "memory": "2Gi"}, "env": {"SEED": "1", "API_TOKEN": "t"},
    "nccl": {"debug": "INFO"}, "sweep": {"lr": [0.1, 0.01]}, "max_restarts": 1,
    "slurm": {"partition": "gpu", "time": "01:00:00"}, "k8s": {"namespace": "ml"}, "local": {}, "workdir": "work",
    "output_dir": "out/{job_id}",
}
BASE_TEXT = yaml.safe_dump(BASE, sort_keys=False)
FIELDS = ["name", "image", "command", "workdir", "nodes", "procs_per_node", "resources", "resources.cpus",
          "resources.memory", "env", "env.SEED", "env.DB_PASSWORD", "env_from_host", "nccl", "nccl.extra",
          "master_port", "max_restarts", "sweep", "sweep.lr", "output_dir", "local", "slurm", "slurm.sbatch",
          "slurm.container", "k8s", "k8s.env_refs", "colour"]
FRAGMENTS = ["&a ", "*a", "*b", "!!python/object/apply:os.system ", "!!binary ", "!t ", "? ", "[", "]", "{", "}",
             ": ", ", ", "- ", "\n", "\n  ", "\t", "'", '"', "#", "|", ">", "\x00", "\x1b", "\r", "\ufeff", "~",
             "null", "1e999", "-3", "0", "1" * 5000, "<<: *a\n", "---\n", "...\n", "%YAML 1.1\n", "@", "{x}", "{{"]
# Where a value starts (after "key: " or "- "): edits there change values, not only layout.
VALUE_AT = sorted({i + 2 for i in range(len(BASE_TEXT)) if BASE_TEXT[i:i + 2] in (": ", "- ")})
# Scalars YAML reads in surprising ways (YAML 1.1 octal/sexagesimal, huge ints, dates, tags, aliases).
NASTY = ["1" * 5000, "1e999", "-3", "0", "0o777", "0x1F", "0b101", "1_000", "+1", "1:30", "2024-13-45", "=", "~",
         ".nan", "-.inf", "yes", "!!binary aGk=", "!!set {a}", "*undefined", "&x [*x]", '"a\\x00b"', '"\\e[2J"',
         '"a\\nb"', "[", "{a: 1", "? [a]", "|\n  x", "-",
         # Integers Python reads without its 4,300-digit limit but cannot write out (issue 23).
         "0x" + "f" * 4000, "0b" + "1" * 15_000, "1" + ":59" * 3000,
         # Quantities and durations with more digits than a float holds (issue 45, item 10).
         "1" * 2000 + "Gi", "'" + "1" * 400 + ":00:00'"]
LIMIT_RSS_KB = 300 * 1024
PYTHON_TRACEBACK = "Traceback (most recent call last):"

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
text_edits = st.lists(st.tuples(st.sampled_from(VALUE_AT) | st.integers(0, len(BASE_TEXT)), st.integers(0, 6),
                                st.sampled_from(FRAGMENTS) | st.text(max_size=8)), min_size=1, max_size=6)
targets = st.sampled_from(["local", "slurm", "k8s"])
odd_text = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ["", " ", "-1", "nan", "inf", "1e999", "100000000000000000000", "1" * 5000, "0x" + "f" * 4000])


def replace_values(picks: list[tuple[int, str]]) -> str:
    """Replace the value of some ``key: value`` lines of the base spec with a nasty scalar."""
    lines = BASE_TEXT.splitlines()
    keyed = [i for i, line in enumerate(lines) if ": " in line]
    for which, scalar in picks:
        i = keyed[which % len(keyed)]
        lines[i] = lines[i].split(": ", 1)[0] + ": " + scalar
    return "\n".join(lines) + "\n"


def mutate_text(edits: list[tuple[int, int, str]]) -> str:
    text = BASE_TEXT
    for pos, cut, fragment in edits:
        pos = min(pos, len(text))
        text = text[:pos] + fragment + text[pos + cut:]
    return text


def mutate_data(changes: list[tuple[str, object]]) -> str:
    data = yaml.safe_load(BASE_TEXT)
    for dotted, value in changes:
        cur = data
        *parents, last = dotted.split(".")
        for p in parents:
            cur = cur.setdefault(p, {}) if isinstance(cur, dict) else {}
        if isinstance(cur, dict):
            cur[last] = value
    return yaml.safe_dump(data, allow_unicode=True)


def check(args: list[str], allowed: tuple[int, ...]) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = CliRunner().invoke(cli, args, catch_exceptions=True)
    out = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert result.exit_code in allowed, (args, result.exit_code, out[-2000:])
    # Python's own header line, not the word: a file or job named "Traceback" is echoed back in a message.
    assert PYTHON_TRACEBACK not in out and "internal error" not in out, (args, out[-2000:])
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < LIMIT_RSS_KB, args


def spec_commands(text: str, target: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "spec.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        check(["validate", str(path)], (0, 2))
        check(["submit", str(path), "--dry-run", "--target", target], (0, 2))


# 120, or what $DDPJOB_FUZZ_EXAMPLES says (the pure tier sets 40 unless it is set: tests/conftest.py).
EXAMPLES = int(os.environ.get("DDPJOB_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(FUZZ, max_examples=3 * EXAMPLES)  # the cheapest cases, and where the YAML corner cases are
@given(edits=text_edits, target=targets)
# Found by this test in a fresh clone (issue 45, item 10): 5,000 digits before `2Gi` were a float's
# infinity, and math.ceil(inf) an OverflowError, exit 70.
@example(edits=[(BASE_TEXT.index("memory: 2Gi") + len("memory: "), 0, "1" * 5000)], target="local")
@example(edits=[(BASE_TEXT.index("time: 01:00:00") + len("time: "), 0, "1" * 2000)], target="slurm")
def test_mutated_spec_text(edits, target):
    spec_commands(mutate_text(edits), target)


def test_every_nasty_scalar_in_every_field(tmp_path):
    """Not random: each nasty scalar as the value of each field of the base spec, each target in turn,
    through ``submit --dry-run``: it reads the spec as ``validate`` does, then plans and renders it (where
    a value becomes a number: the 5,000-digit quantity of issue 45 failed there). ``validate``'s own
    lines (its report) are fuzzed by the random cases above and below (``spec_commands``)."""
    keyed = len([line for line in BASE_TEXT.splitlines() if ": " in line])
    path = tmp_path / "spec.yaml"
    for i in range(keyed):
        for j, scalar in enumerate(NASTY):
            path.write_text(replace_values([(i, scalar)]), encoding="utf-8", errors="surrogatepass")
            check(["submit", str(path), "--dry-run", "--target", ("local", "slurm", "k8s")[(i + j) % 3]], (0, 2))


@FUZZ
@given(picks=st.lists(st.tuples(st.integers(0, 100), st.sampled_from(NASTY)), min_size=2, max_size=4), target=targets)
def test_nasty_scalars(picks, target):
    spec_commands(replace_values(picks), target)


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), values), min_size=1, max_size=4), target=targets)
def test_mutated_spec_values(changes, target):
    spec_commands(mutate_data(changes), target)


@FUZZ
@given(
    target=targets,
    options=st.lists(st.tuples(st.sampled_from(["--set", "-p", "--nodes", "--name", "--set"]),
                               st.tuples(st.sampled_from(FIELDS), odd_text).map(lambda kv: f"{kv[0]}={kv[1]}") | odd_text),
                     max_size=4),
    command=st.lists(odd_text, min_size=0, max_size=3),
)
def test_mutated_submit_command_lines(target, options, command):
    flat = [x for pair in options for x in pair]
    check(["submit", "--dry-run", "--target", target, *flat, "--", "python", "train.py", *command], (0, 2))


@FUZZ
@given(verb=st.sampled_from(["status", "logs", "cancel", "wait"]), job_id=odd_text,
       option=st.sampled_from([[], ["--node"], ["--rank"], ["--task"], ["--tail"], ["--timeout"], ["-o"]]),
       value=odd_text)
def test_mutated_job_command_lines(verb, job_id, option, value):
    args = [verb, job_id, *(option + [value] if option else [])]
    check(args, (0, 2, 4))


@settings(max_examples=EXAMPLES * 10 // 3, deadline=None)  # 400 at 120
@given(raw=st.from_regex(r"[+-]?[0-9][0-9_]{0,20}", fullmatch=True) | st.text(st.characters(categories=["Nd"]), max_size=6)
       | st.sampled_from(["0", "00", "007", "08", "1" * 18, "1" * 19, "1" * 5000, "\u0661", "٣"]))
def test_a_set_value_of_digits_reads_as_yaml_reads_it(raw):
    """``--nodes 2`` is read without loading a YAML parser (launcher.spec.yamlread.parse_value): what it
    gives must be what the YAML reading gives for every text of digits (YAML 1.1 octal ``007``,
    ``1_000``, signs, long numbers, non-ASCII digits)."""
    from launcher.core.errors import SpecError
    from launcher.spec import yamlread as specyaml

    try:
        by_yaml = specyaml.parse(raw, None, "--set x")[0]
    except SpecError as e:
        by_yaml = e.issues[0].message
    try:
        got = specyaml.parse_value(raw, "--set x")
    except SpecError as e:
        got = e.issues[0].message
    if isinstance(by_yaml, str) and by_yaml.startswith("YAML syntax error"):
        by_yaml = raw
    assert (type(got), got) == (type(by_yaml), by_yaml)


# What may stand where a spec goes: never a command (that needs --), always refused unless a spec.
NOT_SPECS = ["/etc/passwd", "/dev/null", "/dev/stdin", "/", ".", "train.py", "spec.YAML", "python", "-x", "--",
             "x.yml", "/proc/self/status", "jobs", "README.md", "pyproject.toml"]


@FUZZ
@given(verb=st.sampled_from([["validate"], ["render"], ["submit", "--dry-run"], ["submit", "--dry-run", "-t", "k8s"]]),
       words=st.lists(st.sampled_from(NOT_SPECS) | odd_text, min_size=1, max_size=3))
@example(verb=["validate"], words=["Traceback"])  # a file named so is named in the message, and is no traceback
def test_anything_given_as_a_spec_is_read_as_one(verb, words):
    """Without --, every argument is a spec file: what is not one is exit 2, never a job of a command."""
    if words[0] == "--":
        words = words[1:] or ["x"]
    with tempfile.TemporaryDirectory() as d:
        cwd = os.getcwd()
        os.chdir(d)
        try:
            Path("train.py").write_text("print(1)\n")
            Path("spec.YAML").write_text("name: [\n")
            check([*verb, *[w for w in words if w != "--"]], (2,))
        finally:
            os.chdir(cwd)


@FUZZ
@given(verb=st.sampled_from([["list", "--limit"], ["logs", "x", "--tail"], ["logs", "x", "--node"]]),
       value=st.integers(-(10**30), 10**30).map(str) | odd_text)
def test_counts_of_any_size(verb, value):
    check([*verb, value], (0, 2, 4))


api_values = values | st.binary(max_size=4) | st.sampled_from([10**5000, -(10**5000), 1 << 20_000, b"python"])


@FUZZ
@given(command=st.none() | api_values | st.lists(api_values, max_size=3), nodes=st.none() | api_values,
       overrides=st.dictionaries(st.sampled_from(FIELDS), api_values, max_size=3),
       job_id=api_values)
def test_the_python_api_raises_only_its_typed_errors(command, nodes, overrides, job_id):
    """Every odd value given to the API is a ``DdpjobError`` (max_restarts -1 keeps anything from
    being submitted), never a TypeError, AttributeError or ValueError from inside."""
    import pytest

    from launcher import api

    with pytest.raises(api.DdpjobError):
        api.submit(command=command, nodes=nodes, overrides={**overrides, "max_restarts": -1})
    if not isinstance(job_id, str):
        with pytest.raises(api.JobNotFound):
            api.get(job_id)
