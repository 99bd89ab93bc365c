"""What a job writes and the client reads back is read as typed records (issue 46 item 1): ``plan.json``
through ``shared/planrecord.py``, ``state.json`` through ``local/job/staterecord.py``, a job's handle's
``run_dir`` through ``JobRecord.files_dir``. No other code reads their data by key (walked here as
``test_found_runfolder.py`` walks the file names), and the files of the previous version still read: the
fixtures under ``golden/records/`` are a real quickstart job's (run by the version before the records, its
paths made ``RUN_DIR``) and a sweep's state with every optional key, and what status made of them then
(``previous-read.json``, ``previous-state-sweep-status.json``, written by that version's code) is what it
makes of them now, byte for byte."""

from __future__ import annotations

import ast
import json
from bisect import bisect_left, bisect_right
from pathlib import Path

from testkit import parsed, walked

from launcher.targets.local.job.staterecord import STATE_VERSION, parse_state, read_state, write_state
from launcher.targets.local.payload import LocalHandle
from launcher.targets.local.status import job_status
from launcher.targets.local.target import LocalTarget
from launcher.targets.shared.planrecord import PLAN_VERSION, parse_plan, read_plan_record
from launcher.targets.shared.runfolder import RunFolder

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "launcher"
FIXTURES = Path(__file__).parent / "golden" / "records"
# The one reader of each record, and the run folder's owner, which hands them the raw JSON.
OWNERS = {Path("launcher/targets/shared/planrecord.py"), Path("launcher/targets/local/job/staterecord.py"),
          Path("launcher/targets/shared/runfolder.py"), Path("launcher/service/records.py")}
# Reads by key that remain, and why: the local supervisor's quick start reads the plan.json its own submit
# has just written as namespaces of the typed payload's shape (LocalPayload: the target's own payload, not
# the record others read), without importing dataclasses (tests/bench/cli_bench.py ``tricks``).
ALLOWED = {("launcher/targets/local/job/supervisor.py", "read_plan")}
FILE_ATTRS = {"plan", "state"}  # RunFolder(...).plan / .state: the two files' paths


def _is_file_path(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in FILE_ATTRS


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


class _Reads(ast.NodeVisitor):
    """Within one function: the names bound to a record's raw data, and every key read from them."""

    def __init__(self, sources: set[str]) -> None:
        self.sources, self.tainted, self.handles = sources, set[str](), set[str]()
        self.found: list[int] = []

    def raw(self, node: ast.expr | None) -> bool:
        """``node`` is plan.json's or state.json's data as JSON (or a name bound to it, or ``x or {}``)."""
        if isinstance(node, ast.BoolOp):
            return any(self.raw(v) for v in node.values)
        if isinstance(node, ast.Name):
            return node.id in self.tainted
        if not isinstance(node, ast.Call):
            return False
        name = _call_name(node)
        if name in ("read_plan", "read_state") and isinstance(node.func, ast.Attribute) and not node.args:
            return True  # RunFolder(run_dir).read_plan() / .read_state()
        if name == "read_json" and node.args and _is_file_path(node.args[0]):
            return True
        if name in ("load", "loads") and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in self.handles:
            return True  # json.load(f), f opened on RunFolder(...).plan
        return name in self.sources  # a function of the package that returns the raw data

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            ctx = item.context_expr
            if (isinstance(ctx, ast.Call) and _call_name(ctx) == "open" and ctx.args and _is_file_path(ctx.args[0])
                    and isinstance(item.optional_vars, ast.Name)):
                self.handles.add(item.optional_vars.id)
        self.generic_visit(node)

    def _bind(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        if self.raw(value):
            self.tainted |= {t.id for t in targets if isinstance(t, ast.Name)}

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        self._bind(node.targets, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        self._bind([node.target], node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.generic_visit(node)
        self._bind([node.target], node.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.raw(node.value) or _handle(node.value):
            self.found.append(node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("get", "items", "keys", "values", "setdefault", "pop") and (
                self.raw(f.value) or _handle(f.value)):
            self.found.append(node.lineno)
        self.generic_visit(node)


def _handle(node: ast.expr) -> bool:
    """A job's handle as the registry keeps it (JSON): ``rec.handle``, ``rec.handle or {}``."""
    if isinstance(node, ast.BoolOp):
        return any(_handle(v) for v in node.values)
    return isinstance(node, ast.Attribute) and node.attr == "handle"


def _functions(path: Path) -> list[ast.AST]:
    """The module and each function in it, nested ones too."""
    return [parsed(path), *(n for n in walked(path) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]


def _body_only(fn: ast.AST) -> list[ast.stmt]:
    """A function's own statements (or a module's), nested functions left to their own walk."""
    body = fn.body if isinstance(fn, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) else []
    return [s for s in body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            ] + [s for c in body if isinstance(c, ast.ClassDef) for s in c.body
                 if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _walk(fn: ast.AST, sources: set[str]) -> _Reads:
    reads = _Reads(sources)
    for stmt in _body_only(fn):
        reads.visit(stmt)
    return reads


def _returns_raw(fn: ast.FunctionDef | ast.AsyncFunctionDef, sources: set[str]) -> bool:
    reads = _walk(fn, sources)
    return any(isinstance(r, ast.Return) and reads.raw(r.value) for r in ast.walk(fn))


# The calls through which raw data comes in (``_Reads.raw``): a function that makes none of these, nor
# of the package's functions found to return the raw data, can neither hold it nor hand it on.
RAW_CALLS = frozenset({"read_plan", "read_state", "read_json", "load", "loads"})


def _with_calls(path: Path) -> list[tuple[ast.AST, frozenset[str]]]:
    """Each of ``_functions(path)`` with the names it calls, nested functions' included (a superset of
    what ``_walk`` sees: by line, from the module's one walk), and "handle" where it reads an attribute
    of that name (``_handle``)."""
    marks = sorted((n.lineno, _call_name(n) if isinstance(n, ast.Call) else "handle") for n in walked(path)
                   if isinstance(n, ast.Call) or (isinstance(n, ast.Attribute) and n.attr == "handle"))
    lines = [line for line, _ in marks]
    out: list[tuple[ast.AST, frozenset[str]]] = []
    for fn in _functions(path):
        first, last = (fn.lineno, fn.end_lineno or fn.lineno) if isinstance(fn, ast.stmt) else (0, 1 << 30)
        out.append((fn, frozenset(name for _, name in marks[bisect_left(lines, first):bisect_right(lines, last)])))
    return out


def reads_by_key(root: Path = PKG) -> list[str]:
    """``path:line (function)`` of every read by key of plan.json's or state.json's data (or a handle's)
    outside the record modules; the functions that hand the raw data on count as its readers too.
    Only the functions whose calls could bring the raw data in are walked (``_with_calls``): the same
    findings in less than half the time."""
    functions = {path: _with_calls(path) for path in sorted(root.rglob("*.py"))}
    rel = {path: path.relative_to(root.parent) for path in functions}
    sources: set[str] = set()
    while True:  # the package's functions that return the raw data (a wrapper of RunFolder.read_state)
        raw = RAW_CALLS | sources
        more = {fn.name for path, fns in functions.items() if rel[path] not in OWNERS for fn, calls in fns
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and calls & raw and _returns_raw(fn, sources)}
        if more <= sources:
            break
        sources |= more
    wrong = []
    raw_or_handle = RAW_CALLS | sources | {"handle"}
    for path, fns in functions.items():
        if rel[path] in OWNERS:
            continue
        for fn, calls in fns:
            name = getattr(fn, "name", "<module>")
            if (str(rel[path]), name) in ALLOWED or not calls & raw_or_handle:
                continue
            wrong += [f"{rel[path]}:{line} ({name})" for line in _walk(fn, sources).found]
    return wrong


def test_no_code_reads_a_jobs_records_by_key():
    """plan.json and state.json are read through their records; a handle's run_dir through ``JobRecord``."""
    assert reads_by_key() == []


def test_the_check_finds_each_way_they_were_read_by_key(tmp_path):
    """The ways the package read them before the records (issue 46), planted in a package of their own (the
    whole package is walked by the test above): each is found."""
    pkg = tmp_path / "launcher"
    pkg.mkdir()
    (pkg / "planted.py").write_text(
        "import json\n"
        "from launcher.targets.shared.files import read_json\n"
        "from launcher.targets.shared.runfolder import RunFolder\n"
        "def metrics(handle):\n"
        "    plan = RunFolder(handle.run_dir).read_plan()\n"
        "    return plan.get('elements', []) if isinstance(plan, dict) else []\n"  # 6
        "def legacy_state(run_dir):\n"
        "    return RunFolder(run_dir).read_state()\n"
        "def terminal(run_dir):\n"
        "    return legacy_state(run_dir)['state']\n"  # 10: through a wrapper
        "def cgroup(run_dir, rec):\n"
        "    x = (read_json(RunFolder(run_dir).state) or {}).get('cgroup')\n"  # 12
        "    run = str(rec.handle.get('run_dir') or rec.run_dir)\n"  # 13
        "    with open(RunFolder(run).plan) as f:\n"
        "        data = json.load(f)\n"
        "    return data['port'], x\n"  # 16
        "def fine(run_dir):\n"
        "    state = read_json(RunFolder(run_dir).task(0).watch)\n"
        "    return state.get('updated'), RunFolder(run_dir).read_plan() is None\n")
    assert [w.split(" ")[0] for w in reads_by_key(pkg)] == [
        "launcher/planted.py:6", "launcher/planted.py:10", "launcher/planted.py:12", "launcher/planted.py:13",
        "launcher/planted.py:16"]


def _run_folder(tmp_path: Path, **files: str) -> str:
    run = tmp_path / "run"
    run.mkdir()
    for name, fixture in files.items():
        (run / f"{name}.json").write_text((FIXTURES / fixture).read_text().replace("RUN_DIR", str(run)))
    return str(run)


def test_the_previous_versions_plan_and_state_read_as_they_did(tmp_path):
    """A quickstart job's plan.json and state.json as the version before the records wrote them: status,
    the metrics files and the nodes' startup files are, byte for byte, what that version made of them."""
    run = _run_folder(tmp_path, plan="previous-plan.json", state="previous-state.json")
    handle, target = LocalHandle(job_id="quickstart-pesse", run_dir=run, pid=0, start=None), LocalTarget()
    now = {"status": job_status(handle).to_json(), "metrics": target.metrics_files(handle),
           "startup": target.startup_files(handle)}
    assert json.dumps(now).replace(run, "RUN_DIR") == (FIXTURES / "previous-read.json").read_text().strip()
    plan, state = read_plan_record(run), read_state(run)
    assert plan is not None and plan.version == PLAN_VERSION and [el.index for el in plan.elements] == [0]
    assert plan.elements[0].output_dir == f"{run}/output" and plan.elements[0].params == {}
    assert state is not None and state.version == 0 and state.terminal and state.port == 20177


def test_a_previous_sweeps_state_with_every_optional_key_reads_and_writes_back(tmp_path):
    """Losses, restarts, a node's own error, what was left behind, a run never started: status as the
    previous version told it; written back, the file is the same but for its version."""
    run = _run_folder(tmp_path, state="previous-state-sweep.json")
    status = job_status(LocalHandle(job_id="sweep-x", run_dir=run, pid=0, start=None)).to_json()
    assert json.dumps(status).replace(run, "RUN_DIR") == (FIXTURES / "previous-state-sweep-status.json").read_text().strip()
    old = json.loads(Path(run, "state.json").read_text())
    state = read_state(run)
    assert state is not None
    write_state(RunFolder(run).state, state)
    assert json.loads(Path(run, "state.json").read_text()) == {**old, "version": STATE_VERSION}


def test_a_missing_or_mistyped_key_reads_as_its_old_default():
    """As the readers by key defaulted them: no elements, no message, no times; not a mapping: no record."""
    state = parse_state({"state": "RUNNING", "elements": [{"nodes": [{"node": 0, "log": "l", "extra": 1}]}, "x"]})
    assert state is not None and (state.version, state.message, state.started, state.ended, state.port) == (0, "", None, None, None)
    [el] = state.elements
    assert (el.index, el.message, el.losses, el.restarts, el.nodes[0].to_json()) == (
        0, "", None, 0, {"exit_code": None, "extra": 1, "log": "l", "node": 0, "pid": None})
    assert parse_state([1]) is None and parse_plan("x") is None
    plan = parse_plan({"elements": [{"index": True, "output_dir": 3, "nodes": [{"log": "a"}, 5]}, {"index": 1}]})
    assert plan is not None and [(el.index, el.output_dir) for el in plan.elements] == [(None, None), (1, None)]
    assert plan.startup_files() == [[]] and plan.metrics_dirs() == []
