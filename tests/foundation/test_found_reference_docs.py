"""The generated references (issue 45 item 6): docs/commands.md lists every command and option and
docs/spec.md every spec field, each in a block that ``python -m launcher.cli.reference`` writes from the
code. A page whose block differs from what the code makes now fails, with the command that fixes it;
and, read apart from the generator, every command, option and field must be in its page's block, so a
generator that leaves something out fails too. Pure: nothing is run but the generator."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from pydantic import BaseModel

from launcher.cli import reference

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def block(page: str, name: str) -> str:
    """The text between reference ``name``'s markers on ``page``."""
    text = (DOCS / page).read_text()
    assert text.count(reference.begin(name)) == 1, f"docs/{page} lacks the line {reference.begin(name)!r}"
    return text.split(reference.begin(name) + "\n", 1)[1].split(reference.END, 1)[0]


def _unpinned() -> list[str]:
    """The formatters of the references (click's option lines, pydantic's schema) at versions other than
    constraints.txt pins (CI's drift run, a user's newer install): their words may differ there."""
    from importlib.metadata import version

    pins = dict(line.strip().split("==", 1) for line in (REPO / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    return [f"{name} {version(name)} (pinned {pins.get(name)})" for name in ("click", "pydantic")
            if pins.get(name) != version(name)]


@pytest.mark.parametrize(("name", "page"), reference.REFERENCES)
def test_each_page_holds_the_reference_the_code_makes_now(name: str, page: str) -> None:
    if _unpinned():
        pytest.skip(f"the pages are generated with constraints.txt's versions; here: {', '.join(_unpinned())} "
                    "(every command, option and field is still checked below)")
    shown, made = block(page, name), reference.reference(name)
    diff = "".join(difflib.unified_diff(shown.splitlines(True), made.splitlines(True), f"docs/{page}", "generated"))
    assert shown == made, f"docs/{page} is stale: run {reference.COMMAND}\n{diff}"


# --------------------------------------------------------------------------- commands and options

def commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, f"{path} {name}")


def missing_options(root: click.Command, text: str) -> list[str]:
    """Each command of ``root`` without its heading in ``text``, and each option (its every name) not
    under its command's heading."""
    sections = dict(re.findall(r"^### ([^\n]+)\n(.*?)(?=^### |\Z)", text, re.M | re.S))
    missing = []
    for path, command in commands(root, "ddpjob"):
        if path not in sections:
            missing.append(path)
            continue
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                missing += [f"{path} {opt}" for opt in param.opts + param.secondary_opts
                            if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", sections[path])]
    return missing


def test_every_command_and_option_is_in_the_commands_page() -> None:
    from launcher.cli.main import cli

    assert missing_options(cli, block("commands.md", "commands")) == []
    assert len(list(commands(cli, "ddpjob"))) > 20


def test_the_check_sees_a_new_option_and_a_new_command() -> None:
    """An option or a command added to the code is missing from the page until it is regenerated."""
    from launcher.cli.main import cli

    text = block("commands.md", "commands")
    doctor = cli.commands["doctor"]
    extra = click.Option(["--warmup"], type=int, help="Untimed all-reduces first.")
    new = click.Command("newcmd", callback=lambda: None)
    try:
        doctor.params.append(extra)
        cli.add_command(new)
        assert missing_options(cli, text) == ["ddpjob doctor --warmup", "ddpjob newcmd"]
        assert reference.commands_reference() != text  # and the page is stale
    finally:
        doctor.params.remove(extra)
        cli.commands.pop("newcmd")
    assert reference.commands_reference() == text


def test_the_commands_page_has_doctors_sizes_and_cancels_task_in_its_synopsis() -> None:
    """Issue 45 item 6: the short form at the top named neither; each of its lines is one command."""
    synopsis = (DOCS / "commands.md").read_text().split("```")[1]
    assert "--max-mib" in synopsis and "--iters" in synopsis and "--task I" in synopsis
    for line in synopsis.strip().splitlines():
        assert line.split("#", 1)[0].count("ddpjob ") == 1, line


# --------------------------------------------------------------------------- spec fields

def _models_in(annotation: object) -> Iterator[tuple[str, type[BaseModel]]]:
    """(suffix, model) for each model an annotation holds: ``X`` or ``X | None`` -> "", ``list[X]`` ->
    "[]", ``dict[str, X]`` -> ".<NAME>"."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in args[:1] if origin is typing.Annotated else args:
            yield from _models_in(arg)
    elif origin is list and args:
        yield from (("[]" + s, m) for s, m in _models_in(args[0]))
    elif origin is dict and len(args) == 2:
        yield from ((".<NAME>" + s, m) for s, m in _models_in(args[1]))


def field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field's dotted path, read from the models themselves (not from the schema the generator reads)."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path
        for suffix, sub in _models_in(info.annotation):
            yield from field_paths(sub, f"{path}{suffix}.")


def missing_fields(model: type[BaseModel], text: str) -> list[str]:
    return [path for path in field_paths(model) if f"- `{path}` (" not in text]


def test_every_spec_field_is_in_the_spec_page() -> None:
    from launcher.spec.model import spec_model

    text = block("spec.md", "spec")
    assert missing_fields(spec_model(), text) == []
    paths = set(field_paths(spec_model()))  # the ones issue 45 item 6 found in no page
    assert {"build", "master_port", "max_restarts", "nccl", "stall", "workdir", "k8s.volumes[].pvc",
            "k8s.tolerations[].key", "k8s.elastic.min_nodes", "k8s.env_from[].secret", "k8s.service_account",
            "k8s.env_refs.<NAME>.key", "local.omp_num_threads", "local.stop_on_failure"} <= paths


def test_the_check_sees_a_new_field() -> None:
    from pydantic import Field, create_model

    from launcher.spec.model import JobSpec
    from launcher.targets.local.options import LocalOptions

    text = block("spec.md", "spec")
    local = create_model("LocalOptions", __base__=LocalOptions, cpu_bind=(bool, Field(False, description="x")))
    spec = create_model("JobSpec", __base__=JobSpec, local=(local, Field(default_factory=local)))
    assert missing_fields(spec, text) == ["local.cpu_bind"]


def test_a_field_reads_with_its_type_default_and_description() -> None:
    text = block("spec.md", "spec")
    assert "- `name` (string, required): Job name" in text
    assert "- `nodes` (integer 1 to 1024, default `1`): Number of nodes" in text
    assert "- `procs_per_node` (integer 1 to 1024 or `auto`, default `auto`): " in text
    assert "- `k8s.volumes[].mount_path` (string, required): " in text
    assert "- `notify.when` (list of any of `succeeded`, `failed`, `cancelled`, default " in text


def test_omp_num_threads_says_what_it_is_once_resources_cpus_is_set() -> None:
    """Issue 45 item 6: with resources.cpus the default is cpus / processes per node, not this machine's share."""
    from launcher.targets.local.options import LocalOptions

    description = LocalOptions.model_fields["omp_num_threads"].description or ""
    assert "resources.cpus / processes per node" in description and "oversubscri" in description


@pytest.mark.parametrize(("sets", "note"), [
    (["resources.cpus=4"], "6 processes x OMP_NUM_THREADS=2 (resources.cpus 4 / 2 process(es) per node) = 12 threads "
     "on this machine's 2 core(s): oversubscribed, every rank waits for a core; local.omp_num_threads: 1 gives each "
     "process its share"),
    (["resources.cpus=4", "env.OMP_NUM_THREADS=3"], "6 processes x OMP_NUM_THREADS=3 (env.OMP_NUM_THREADS) = 18 "
     "threads on this machine's 2 core(s): oversubscribed, every rank waits for a core; env.OMP_NUM_THREADS: 1 "
     "gives each process its share"),
    ([], None),  # the quickstart's resources.cpus 1: one thread each, the least there is, never named
    (["resources.cpus=2", "nodes=1", "procs_per_node=1"], None),  # 2 threads on 2 cores
])
def test_render_says_when_the_threads_oversubscribe_this_machine(sets: list[str], note: str | None) -> None:
    """``render -n 3 -p 2 --set resources.cpus=4`` on 2 cores gave OMP_NUM_THREADS=2 to 6 processes without a word."""
    from launcher.spec.load import load_spec
    from launcher.targets.base import PlanContext
    from launcher.targets.local.target import LocalTarget

    ctx = PlanContext(job_id="demo-abcde", run_dir="/home/u/.ddpjob/runs/demo-abcde", port=29501, cpu_count=2,
                      gpu_count=0, home="/home/u", cwd="/work/proj", python="/usr/bin/python3")
    loaded = load_spec(REPO / "jobs" / "quickstart.yaml", overrides=["nodes=3", "procs_per_node=2", *sets])
    text = LocalTarget().plan(loaded, ctx).render()
    notes = [line for line in text.splitlines() if "OMP_NUM_THREADS" in line and line.startswith("# note:")]
    assert notes == ([f"# note: {note}"] if note else []), text[:600]


# --------------------------------------------------------------------------- the writer

def test_regenerating_keeps_the_prose_and_needs_the_markers(tmp_path: Path) -> None:
    for name, page in reference.REFERENCES:
        (tmp_path / page).write_text(f"# Page\n\nprose before\n\n{reference.begin(name)}\nstale words\n{reference.END}\n\nafter\n")
    assert reference.update(str(tmp_path), check=True) == [page for _, page in reference.REFERENCES]
    assert (tmp_path / "spec.md").read_text().count("stale words") == 1  # --check writes nothing
    assert reference.update(str(tmp_path), check=False) == [page for _, page in reference.REFERENCES]
    text = (tmp_path / "spec.md").read_text()
    assert text.startswith("# Page\n\nprose before\n\n") and text.endswith(f"{reference.END}\n\nafter\n")
    assert "stale words" not in text and "- `local.omp_num_threads` (" in text
    assert reference.update(str(tmp_path), check=True) == []
    with pytest.raises(ValueError, match="once"):
        reference.with_reference("# Page\n", "spec", "x\n")


# Issue 45 item 8: one combination of a sweep had four names ("run", "sweep element", "array element",
# "task"); status, logs --task and cancel --task say "task", so every description does.
OTHER_NAMES = re.compile(r"sweep element|array element|\belements?\b|one run per|runs? of a sweep|per run\b", re.I)


def test_a_task_of_a_sweep_has_one_name_in_every_option_and_field():
    for name, text in (("commands", reference.commands_reference()), ("spec", reference.spec_reference())):
        found = [line.strip()[:160] for line in text.splitlines() if OTHER_NAMES.search(line)]
        assert not found, (name, found)
    terms = (DOCS / "spec.md").read_text()
    assert "**Job, task, node, rank.**" in terms and "`DDPJOB_SWEEP_INDEX`" in terms
