"""The shape of the house: one package per target, no import cycles, small modules, a CLI that
imports no target, and one plan for render, --dry-run and submit."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from testkit import parsed, walked

from launcher.core.plugins import BUILTIN

TARGET_NAMES = tuple(BUILTIN)  # the built-in targets: packages under launcher/targets

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "launcher"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


@functools.cache
def all_imports(path: Path) -> list[ast.AST]:
    """Every import statement of the module, wherever it is (one walk of its tree for all the graphs)."""
    return [n for n in walked(path) if isinstance(n, (ast.Import, ast.ImportFrom))]


@functools.cache
def type_checking_imports(path: Path) -> frozenset[int]:
    """The import statements (their ids) inside the module's ``if TYPE_CHECKING:`` blocks."""
    return frozenset(
        id(n) for node in walked(path) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))


def top_statements(body: list[ast.stmt]) -> list[ast.AST]:
    """The statements run when a module is imported: not those inside functions or classes."""
    out: list[ast.AST] = []
    for node in body:
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                out += top_statements(getattr(node, field, []) or [])
            for h in getattr(node, "handlers", []):
                out += top_statements(h.body)
    return out


@functools.cache
def imports(path: Path, *, top_level_only: bool, by_type: bool = False) -> frozenset[str]:
    """Modules of ``launcher`` that ``path`` imports, outside ``if TYPE_CHECKING:`` blocks (inside
    them too with ``by_type``); with ``top_level_only``, only those run when the module is imported
    (not inside functions)."""
    tree = parsed(path)
    skip = frozenset() if by_type else type_checking_imports(path)

    nodes = top_statements(tree.body) if top_level_only else all_imports(path)
    found: set[str] = set()
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in MODULES else node.module)
    return frozenset(m for m in found if m.startswith("launcher"))


def test_no_module_is_over_400_lines():
    long = {name: n for name, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def import_graph(*, top_level_only: bool, by_type: bool = False) -> dict[str, set[str]]:
    graph = {name: set(imports(path, top_level_only=top_level_only, by_type=by_type)) & set(MODULES)
             for name, path in MODULES.items()}
    for name in graph:  # importing a.b.c runs a and a.b first: parents count as imports too
        graph[name] |= {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} & set(MODULES)
        graph[name].discard(name)
    return graph


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def dfs(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):  # a package's own __init__ is not a cycle
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                dfs(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            dfs(name, [name])
    return cycles


def test_no_import_cycle_between_launcher_modules():
    """Not at import time, not through imports inside functions (a lazy import only hides a circle),
    and not through ``if TYPE_CHECKING:`` imports either: a circle of types is a circle of ideas
    (issue 35 item 4; the spec <-> targets and jobs <-> queue circles were of that kind)."""
    assert cycles_of(import_graph(top_level_only=True)) == []
    assert cycles_of(import_graph(top_level_only=False)) == []
    assert cycles_of(import_graph(top_level_only=False, by_type=True)) == []


def test_the_graph_check_finds_a_lazy_circle():
    """The check above is not blind to imports inside functions."""
    graph = import_graph(top_level_only=False)
    graph["launcher.core.errors"] = graph["launcher.core.errors"] | {"launcher.service.jobs"}
    assert cycles_of(graph) != []


def test_the_graph_check_sees_imports_made_for_types_only(tmp_path):
    """An import under ``if TYPE_CHECKING:`` is an edge of the full graph (and only of that one)."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                      "    from launcher.service.jobs import Jobs\n")
    assert imports(source, top_level_only=False, by_type=True) == {"launcher.service.jobs"}
    assert imports(source, top_level_only=False) == set()


def package_of(module: str) -> str:
    """``launcher.spec.load`` -> ``spec``; a target's spec section is ``targets.options``."""
    parts = module.split(".")[1:]
    if not parts:
        return "launcher"
    if parts[0] == "targets" and len(parts) > 2 and parts[1] in TARGET_NAMES and parts[2] == "options":
        return "targets.options"
    if parts[0] == "targets" and (len(parts) == 1 or (len(parts) == 2 and parts[1] in TARGET_NAMES)):
        return "targets.names"  # launcher/targets/__init__.py (the names) and each target's package docstring
    return parts[0]


# What each package may import of ddpjob besides itself (and the ``launcher`` package's version);
# each package's __init__ docstring says the same in words.
ALLOWED = {
    "core": set(),
    "spec": {"core"},  # the targets' sections come through core.plugins: no knot between spec and targets
    "targets.names": {"core"},
    "targets.options": {"core", "targets.names"},  # its own package, above it
    "targets": {"core", "spec", "targets.names", "targets.options"},
    "service": {"core", "spec", "targets", "targets.names", "targets.options"},
    "doctor": {"core", "spec", "targets", "targets.names", "service", "train"},
    "ui": {"core", "spec", "targets", "targets.names", "service"},
    "cli": {"core", "spec", "targets", "targets.names", "service", "doctor", "ui"},
    "api": {"core", "spec", "targets", "targets.names", "service"},
    "__main__": {"cli"},
    "train": set(),
    "launcher": set(),
}


def test_packages_import_only_what_their_docstring_allows():
    wrong = []
    for name, deps in import_graph(top_level_only=False, by_type=True).items():
        src = package_of(name)
        for dep in deps:
            dst = package_of(dep)
            if dst not in (src, "launcher") and dst not in ALLOWED[src]:
                wrong.append(f"{name} -> {dep}")
    assert wrong == []


def test_every_package_says_what_it_owns_and_may_import():
    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 60, f"{init} needs a docstring: what the package owns and what it may import"
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "api.py"], "modules belong in a package by concern"


def cli_modules() -> list[Path]:
    return sorted((PKG / "cli").glob("*.py"))


def test_cli_imports_no_target_package_and_targets_never_import_each_other():
    for path in cli_modules():
        cli_imports = imports(path, top_level_only=False)
        assert not [m for m in cli_imports if any(m.startswith(f"launcher.targets.{t}") for t in TARGET_NAMES)], path
    for name in TARGET_NAMES:
        for path in (PKG / "targets" / name).rglob("*.py"):
            others = [m for m in imports(path, top_level_only=False)
                      if any(m.startswith(f"launcher.targets.{t}") for t in TARGET_NAMES if t != name)]
            assert others == [], path


def test_target_names_are_declared_once():
    """The plugins are the only list: spec sections, --target choices and the schema follow them; the
    built-in targets are registered as any other (ddpjob's own entry points, launcher.core.plugins)."""
    from launcher.core.plugins import plugin, registered
    from launcher.spec.model import json_schema, spec_model

    names = tuple(registered())
    assert names[:3] == TARGET_NAMES and all(registered()[n].distribution == "ddpjob" for n in TARGET_NAMES)
    for name in names:  # the spec's section is the model the target registers
        assert spec_model().model_fields[name].annotation is plugin(name).options, name
    assert set(names) <= set(json_schema()["properties"])
    literal = re.compile(r"""["'](local|slurm|k8s)["']\s*,\s*["'](local|slurm|k8s)["']""")
    for name, path in MODULES.items():
        if name != "launcher.targets":
            assert not literal.search(path.read_text()), f"{path} lists target names"


def test_the_built_in_targets_are_registered_by_pyproject_as_any_plugin_would_be():
    """pyproject.toml's entry points name the objects core.plugins falls back to in a source tree, and
    the light reader finds what importlib.metadata finds."""
    import importlib.metadata

    import tomllib

    from launcher.core.plugins import GROUP, scan

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]
    assert declared == BUILTIN
    found = sorted((r.name, r.ref, r.distribution) for r in scan())
    assert found == sorted((e.name, e.value, e.dist.name if e.dist else "") for e in
                           importlib.metadata.entry_points(group=GROUP))
    assert {(n, r) for n, r, d in found if d == "ddpjob"} == set(BUILTIN.items()), "reinstall: pip install -e ."


def write_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: tiny\ncommand: [python, -c, 'print(1)']\nnodes: 2\n")
    return spec


@pytest.mark.real
def test_render_dry_run_and_submit_give_the_same_plan(cli, tmp_path):
    """What render shows is what submit runs: the same text but for the id and the local port, which
    render shows as placeholders (no port that submit would not use)."""
    spec = write_spec(tmp_path)
    rendered = cli("render", str(spec), "--target", "local", check=True).stdout
    dry = cli("submit", str(spec), "--target", "local", "--dry-run", check=True).stdout
    assert rendered == dry
    assert "<port>" in rendered and not re.search(r"--master-port \d", rendered)
    job_id = cli("submit", "-q", str(spec), "--target", "local", check=True).stdout.strip()
    rec = cli("status", job_id, "-o", "json", check=True).stdout
    port = str(__import__("json").loads(rec)["port"])
    run_dir = Path(__import__("json").loads(rec)["run_dir"])
    submitted = (run_dir / "plan.txt").read_text()
    expected = rendered.replace("tiny-xxxxx", job_id).replace(
        "127.0.0.1:<port> (a free port chosen at submit; master_port: fixes it)", f"127.0.0.1:{port}"
    ).replace("--master-port '<port>'", f"--master-port {port}")
    assert submitted == expected
    assert cli("wait", job_id, "--timeout", "120").returncode == 0


@pytest.mark.parametrize("target", ["slurm", "k8s"])
def test_render_and_dry_run_agree_on_other_targets(cli, tmp_path, target):
    spec = write_spec(tmp_path)
    extra = ["--set", "image=img:1"] if target == "k8s" else []
    rendered = cli("render", str(spec), "--target", target, *extra, check=True).stdout
    assert rendered == cli("submit", str(spec), "--target", target, "--dry-run", *extra, check=True).stdout


def test_a_plan_that_fails_after_the_reservation_leaves_no_job(cli, tmp_path):
    """The id is reserved before the plan; a plan refused by the target's checks releases it."""
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\ncommand: [python, t.py]\nslurm:\n  container: {runtime: pyxis}\n")
    proc = cli("submit", str(spec), "--target", "slurm", "--no-preflight")
    assert proc.returncode == 2 and f"{spec}:" in proc.stderr and "needs an image" in proc.stderr
    assert "no jobs yet" in cli("list", check=True).stdout


def test_submit_path_is_one_service(tmp_path):
    """The CLI goes through launcher.service.jobs for everything it does with jobs (no registry or target
    calls of its own)."""
    text = "".join(p.read_text() for p in cli_modules())
    assert "Registry(" not in text and "get_target(" not in text and ".reserve(" not in text
    from testkit import start_up_modules

    assert "launcher.service.jobs" not in start_up_modules()  # imported by the commands, not at start-up


def test_the_entry_point_loads_nothing_before_its_ctrl_c_handling():
    """Until ``entry.main`` handles Ctrl-C, a Ctrl-C gives Python's traceback: the entry module's top
    imports only what the interpreter has loaded already (issue 23 item 8; ``typing`` alone took
    ~5 ms of that window)."""
    import ast

    tree = ast.parse((REPO / "launcher" / "cli" / "entry.py").read_text())
    top = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert top <= {"__future__", "gc", "sys"}, top


def names_in_architecture(text: str) -> set[str]:
    """The module names ARCHITECTURE.md gives in backticks, dotted: `jobs`, `local/ports.py`,
    `service/jobs.py` and `launcher.service.ports` give ``jobs``, ``local.ports``, ``service.jobs`` and
    ``launcher.service.ports``. A span with spaces (a command, a phrase) names only its paths."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        words = re.findall(r"[\w./]+", span)
        for word in words if len(words) == 1 else [w for w in words if "." in w or "/" in w]:
            name = re.sub(r"\.py$", "", word.strip("./")).replace("/", ".")
            if re.fullmatch(r"\w+(\.\w+)*", name):
                names.add(name)
    return names


def unnamed_modules(text: str) -> list[str]:
    """Modules of ``launcher`` that ``text`` does not name (by their last parts, as above)."""
    names = names_in_architecture(text)
    return sorted(m for m in MODULES if not any(m == n or m.endswith("." + n) for n in names))


def test_every_module_is_named_in_architecture_md():
    """ARCHITECTURE.md is the map: a module it does not name is a part nobody can find (issue 35
    item 4). Name a new one briefly in its package's row or paragraph."""
    assert unnamed_modules((REPO / "ARCHITECTURE.md").read_text()) == []


def test_the_architecture_check_sees_a_missing_module():
    text = (REPO / "ARCHITECTURE.md").read_text()
    assert "launcher.service.queue" in unnamed_modules(text.replace("`queue`", "the queue"))
    assert unnamed_modules("`ruff check` `service/jobs.py`") == sorted(set(MODULES) - {"launcher.service.jobs"})



def table_rows(text: str) -> dict[str, str]:
    """ARCHITECTURE.md's package table: package (``core``, ``api``) -> its "may import" cell."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (m := re.fullmatch(r"`(\w+)(?:/|\.py)`", cells[0])):
            rows[m.group(1)] = cells[2]
    return rows


def may_import(cell: str) -> set[str]:
    """The dotted names a "may import" cell lists (``targets.base``; ``targets.<name>.options`` for each
    target), its words in parentheses left out; none for "nothing of ddpjob"."""
    names = set(re.findall(r"`([\w.<>]+)`", re.sub(r"\([^)]*\)", "", cell)))
    return {n.replace("<name>", t) for n in names for t in (TARGET_NAMES if "<name>" in n else [""])}


def covers(item: str, module: str) -> bool:
    """Whether the table's ``item`` covers an import of ``module``: ``targets`` is the target names
    (``launcher.targets`` and each target's package docstring); any other item is that module and
    everything under it (``targets.shared``: all the shared modules)."""
    if item == "targets":
        return module == "launcher.targets" or module in {f"launcher.targets.{t}" for t in TARGET_NAMES}
    return module == f"launcher.{item}" or module.startswith(f"launcher.{item}.")


def table_drift(text: str) -> list[str]:
    """Where the package table's "may import" column and the imports the code makes disagree: a
    module a package imports that its row does not list, or a listed name nothing of it imports."""
    rows, made = table_rows(text), {}
    for name, deps in import_graph(top_level_only=False, by_type=True).items():
        src = name.split(".")[1] if name.count(".") else "launcher"
        made.setdefault(src, set()).update(d for d in deps if d not in ("launcher", f"launcher.{src}")
                                           and not d.startswith(f"launcher.{src}."))
    wrong = []
    for src, deps in sorted(made.items()):
        if src in ("launcher", "__main__"):
            continue
        items = may_import(rows.get(src, ""))
        wrong += [f"{src} imports {d}: its row does not say so" for d in sorted(deps) if not any(covers(i, d) for i in items)]
        wrong += [f"{src}'s row lists `{i}`: nothing of it imports that" for i in sorted(items)
                  if not any(covers(i, d) for d in deps)]
    return wrong


def test_the_package_table_says_what_each_package_really_imports():
    """ARCHITECTURE.md's "may import" column is read as the imports each package makes, both ways
    (issue 46 item 5: the dashboard and api.py imported what their rows did not say)."""
    assert table_drift((REPO / "ARCHITECTURE.md").read_text()) == []


def test_the_table_check_sees_an_import_left_unsaid_and_a_stale_one():
    text = (REPO / "ARCHITECTURE.md").read_text()
    row = table_rows(text)["api"]
    assert any(w.startswith("api imports launcher.service") for w in table_drift(text.replace(row, "`core`, `spec`")))
    assert "api's row lists `doctor`: nothing of it imports that" in table_drift(text.replace(row, row + ", `doctor`"))


def unmapped(root: Path) -> list[str]:
    """The modules and sub-packages of each package under ``root`` that its ``__init__``'s docstring (the
    package's map) does not name (``stacks`` or ``stacks.py``)."""
    wrong = []
    for init in sorted(root.rglob("__init__.py")):
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", ast.get_docstring(parsed(init)) or ""))
        parts = [p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"]
        parts += [p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()]
        wrong += [f"{init.parent.relative_to(root.parent)}: {name}" for name in sorted(parts) if name not in words]
    return wrong


def test_each_targets_map_names_every_module_in_it():
    """A target's ``__init__`` is its map (ARCHITECTURE.md, "One skeleton per target"): it names every
    module of its package, as ARCHITECTURE.md does (issue 46 item 5: status.py was missing from all
    three, the shared package named 5 of its 15)."""
    assert unmapped(PKG / "targets") == []


def test_the_map_check_sees_a_module_left_out(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text('"""The pkg: ``a`` and its ``sub``."""\n')
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text('"""Nothing named."""\n')
    for name in ("a.py", "b.py", "sub/c.py"):
        (tmp_path / "pkg" / name).write_text("")
    assert unmapped(tmp_path / "pkg") == ["pkg: b", "pkg/sub: c"]
