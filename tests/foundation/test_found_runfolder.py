"""The run folder has one owner (``launcher/targets/shared/runfolder.py``, issue 35 item 2): it names every
file, and nobody else spells those names; the names are the ones older ddpjob versions wrote, so their
run folders still read."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from testkit import walked

from launcher.targets.shared import runfolder
from launcher.targets.shared.runfolder import PodFolder, RunFolder, TaskFolder

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "launcher"
OWNER = PKG / "targets" / "shared" / "runfolder.py"

# A string as the code spells it: a literal, or an f-string with "{}" for each value put in it.
FORBIDDEN = [re.compile(p) for p in (
    r"plan\.(json|txt)", r"state\.json", r"supervisor\.(note|log)", r"cancel-requested", r"k8s-status\.json",
    r"notified\.json", r"notifier\.(log|pid)", r"watch\.json", r"watch-\{\}\.json", r"output\.count",
    r"\.exit\.json", r"\.error\.json", r"torchrun-node-",
    r"(^|/)task-(\{\}|\d|\$)",  # task-<i>/ (and the cgroup named like it); not "--task-epilog"
    r"(^|/)node-(\{\}|\d|\$)[^/ ]*\.(log|json)",  # node-<n>.log/.json; not a pod's label "node-1"
    r"\{\}/(vitals|pods|output)$",  # f"{task}/vitals"
    r"_submission\.sh", r"_log\.(out|err)", r"oci-check\.sh", r"podman-epilog\.sh",  # Slurm's job folder
)]
FOLDERS = {"vitals", "pods", "output"}  # bare names: forbidden only where a path is joined from them


# Each takes every node of a module (``testkit.walked``: ``ast.walk`` of its tree, kept for the other checks).
def _docstrings(nodes: Iterable[ast.AST]) -> set[int]:
    return {id(node.body[0].value) for node in nodes
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _spelled(nodes: Sequence[ast.AST]) -> list[tuple[int, str]]:
    """(line, text) of every string the code holds: literals, bytes and f-strings; docstrings left out."""
    docs, inner, out = _docstrings(nodes), set(), []
    for node in nodes:
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}" for v in node.values]
            inner |= {id(v) for v in node.values}
            out.append((node.lineno, "".join(parts)))
    for node in nodes:
        if isinstance(node, ast.Constant) and id(node) not in docs | inner and isinstance(node.value, (str, bytes)):
            value = node.value if isinstance(node.value, str) else node.value.decode("utf-8", "replace")
            out.append((node.lineno, value))
    return out


def _joined_folders(nodes: Iterable[ast.AST]) -> list[tuple[int, str]]:
    """A bare folder name of the run folder used as a path part: ``os.path.join(x, "vitals")``, ``p / "pods"``."""
    found = []
    for node in nodes:
        args: list[ast.expr] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("join", "joinpath"):
            args = node.args[1:]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            args = [node.right]
        found += [(a.lineno, a.value) for a in args if isinstance(a, ast.Constant) and a.value in FOLDERS]
    return found


def spelled_elsewhere(root: Path = PKG) -> list[str]:
    wrong = []
    for path in sorted(root.rglob("*.py")):
        if path == OWNER:
            continue
        nodes, where = walked(path), path.relative_to(root.parent)
        for line, text in _spelled(nodes):
            if any(p.search(text) for p in FORBIDDEN):
                wrong.append(f"{where}:{line}: {text[:80]!r}")
        wrong += [f"{where}:{line}: {name!r} joined into a path" for line, name in _joined_folders(nodes)]
    return wrong


def test_only_the_owner_spells_the_run_folders_file_names():
    """Every path into a run folder is built by ``shared/runfolder.py``: a file name spelled anywhere
    else in ``launcher/`` (code, not comments or docstrings) is a second owner."""
    assert spelled_elsewhere() == []


def test_the_check_finds_a_name_spelled_again(tmp_path):
    """The grep above sees each way a name was spelled before the owner existed."""
    (tmp_path / "m.py").write_text('"""plan.json in a docstring is fine."""\nimport os\n# state.json in a comment too\n'
                                   'a = os.path.join(d, "plan.json")\nb = f"{d}/task-{i}/node-{n}.log"\n'
                                   'c = os.path.join(t, "vitals")\nd = rec["vitals"]\ne = f"node-{n}"\n'
                                   "f = b'no watch.json yet'\ng = f\"{run}/watch-{i}.json\"\nh = f\"task-{i}-node-{n}\"\n")
    wrong = [w.split(": ", 1)[0].rsplit(":", 1)[1] for w in spelled_elsewhere(tmp_path)]
    assert sorted(wrong, key=int) == ["4", "5", "6", "9", "10", "11"]


def test_the_names_are_the_ones_older_versions_wrote():
    """No file was renamed: a job submitted by an earlier ddpjob is read where it wrote."""
    run = RunFolder("/h/runs/j")
    assert [run.plan, run.plan_text, run.state, run.stale_note, run.supervisor_log, run.cancel_requested,
            run.output, run.k8s_status, run.pods, run.notified, run.notifier_log, run.notifier_pid,
            run.kept_watch(2)] == [
        "/h/runs/j/plan.json", "/h/runs/j/plan.txt", "/h/runs/j/state.json", "/h/runs/j/supervisor.note",
        "/h/runs/j/supervisor.log", "/h/runs/j/cancel-requested", "/h/runs/j/output", "/h/runs/j/k8s-status.json",
        "/h/runs/j/pods", "/h/runs/j/notified.json", "/h/runs/j/notifier.log", "/h/runs/j/notifier.pid",
        "/h/runs/j/watch-2.json"]
    task = run.task(1)
    assert [task.path, task.log(0), task.record(0), task.error_file(3), task.exit_file(0), task.torchrun_logs(1),
            task.watch, task.vitals] == [
        "/h/runs/j/task-1", "/h/runs/j/task-1/node-0.log", "/h/runs/j/task-1/node-0.json",
        "/h/runs/j/task-1/node-3.error.json", "/h/runs/j/task-1/node-0.exit.json",
        "/h/runs/j/task-1/torchrun-node-1", "/h/runs/j/task-1/watch.json", "/h/runs/j/task-1/vitals"]
    assert runfolder.log_of_exit_file(task.exit_file(2)) == task.log(2)
    assert runfolder.node_tag(1, 2) == "task-1-node-2"
    # Shell words and Slurm's runtime markers go through as they are (slurm/container.py, slurm/payload.py).
    assert TaskFolder("$d").log("$n") == "$d/node-$n.log"
    assert RunFolder("/j").task("${SLURM_ARRAY_TASK_ID:-0}").path == "/j/task-${SLURM_ARRAY_TASK_ID:-0}"
    pod = PodFolder("/tmp/ddpjob-pod-x")
    assert [pod.output_count, pod.watch, pod.vitals] == ["/tmp/ddpjob-pod-x/output.count",
                                                         "/tmp/ddpjob-pod-x/watch.json", "/tmp/ddpjob-pod-x/vitals"]
    assert runfolder.WATCH_URL_PATH == "/watch.json"
    slurm = RunFolder("/s/j")  # Slurm's job folder: submitit's names, with its patterns or a plan's placeholders
    assert [slurm.submission_script("<SLURM_JOB_ID>"), slurm.submitit_log("%A_%a", "%t", "out"),
            slurm.submitit_log("12_3", "0", "err"), slurm.oci_check, slurm.podman_epilog] == [
        "/s/j/<SLURM_JOB_ID>_submission.sh", "/s/j/%A_%a_%t_log.out", "/s/j/12_3_0_log.err", "/s/j/oci-check.sh",
        "/s/j/podman-epilog.sh"]


def test_it_reads_and_writes_a_run_folder_atomically(tmp_path):
    """What an older ddpjob wrote reads back (None where a file is missing or not JSON); what it writes
    leaves no temporary file beside it."""
    run = RunFolder(tmp_path)
    assert run.read_plan() is None and run.read_state() is None and run.task(0).read_watch() is None
    (tmp_path / "state.json").write_text(json.dumps({"state": "RUNNING"}))
    (tmp_path / "task-0").mkdir()
    (tmp_path / "task-0" / "watch.json").write_text("{not json")
    assert run.read_state() == {"state": "RUNNING"} and run.task(0).read_watch() is None
    (tmp_path / "task-0" / "watch.json").write_text("[1]")  # not a mapping: not a watch
    assert run.task(0).read_watch() is None
    run.write_plan({"elements": []}, "the plan\n")
    run.write_state({"state": "SUCCEEDED"})
    assert json.loads((tmp_path / "plan.json").read_text()) == {"elements": []}
    assert (tmp_path / "plan.txt").read_text() == "the plan\n" and run.read_plan() == {"elements": []}
    assert run.read_state() == {"state": "SUCCEEDED"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.txt", "state.json", "task-0"]


def test_the_owner_is_standard_library_only_and_light():
    """The supervisor's quick start, the node wrappers and the k8s pod runner (which carries the file in its
    bundle) import it before their children start: nothing of ddpjob, no dataclasses or pathlib."""
    tree = ast.parse(OWNER.read_text())
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top <= {"__future__", "os", "typing"}, top
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import launcher.targets.shared.runfolder; "
            "print(sorted(m for m in ('dataclasses', 'pathlib', 'launcher.targets.shared.files') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out
