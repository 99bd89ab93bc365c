"""The house's wings (issue 35 item 3): the code that runs inside a job in ``targets/<name>/job/``,
importing only the standard library at module top, and one skeleton for every target."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from test_found_layout import MODULES, PKG, imports, parsed, top_statements, type_checking_imports

from launcher.core.plugins import BUILTIN

TARGET_NAMES = tuple(BUILTIN)  # the built-in targets: packages under launcher/targets

# The code that runs inside a job lives in its target's wing, ``targets/<name>/job/`` (issue 35
# item 3). Before its children start it may use the standard library only (the local supervisor and
# node wrapper run as ``python -I -S``; the pod runner runs in an image without ddpjob), so at module
# top a module of the wing imports the standard library, its own wing and these shared in-job
# modules, which follow the same rule (``ddpjob_<name>``: one of them as the pod's bundle names it).
SHARED_IN_JOB = frozenset(f"launcher.targets.shared.{m}"
                          for m in ("heartbeat", "vitals", "straggle", "runfolder", "netif", "files", "restarts", "told",
                                    "stacks", "stackshare", "jobcore", "launch"))


def job_wing(module: str) -> str | None:
    """``launcher.targets.local.job.node`` -> ``launcher.targets.local.job``; None outside a wing."""
    parts = module.split(".")
    return ".".join(parts[:4]) if len(parts) >= 4 and parts[1] == "targets" and parts[3] == "job" else None


def top_level_imports(path: Path) -> set[str]:
    """Every module ``path`` imports when it is imported (not in functions, classes or
    ``if TYPE_CHECKING:``), standard library and third party included."""
    skip = type_checking_imports(path)
    found: set[str] = set()
    for node in top_statements(parsed(path).body):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                         for a in node.names)
    return found


def in_job_wrong(modules: dict[str, Path]) -> list[str]:
    wrong = []
    for name, path in modules.items():
        wing = job_wing(name)
        if wing is None and name not in SHARED_IN_JOB:
            continue
        above = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}  # the packages run first
        for mod in sorted(top_level_imports(path)) + [f"{p} (package)" for p in sorted(above & set(modules))]:
            if mod.endswith(" (package)"):
                wrong += [f"{mod[:-10]} -> {m}" for m in sorted(top_level_imports(modules[mod[:-10]]))
                          if m.split(".")[0] not in sys.stdlib_module_names]
                continue
            ours = mod.split(".")[0] == "launcher"
            if (ours and not ((wing and mod.startswith(wing + ".")) or mod in SHARED_IN_JOB)) or (
                    not ours and mod.split(".")[0] not in sys.stdlib_module_names and not mod.startswith("ddpjob_")):
                wrong.append(f"{name} -> {mod}")
    return wrong


def test_the_in_job_wing_imports_only_the_standard_library_at_module_top():
    wings = {job_wing(m) for m in MODULES} - {None}
    assert wings == {f"launcher.targets.{t}.job" for t in TARGET_NAMES}, "each target has its in-job wing"
    assert in_job_wrong(MODULES) == []


def test_the_in_job_rule_finds_a_forbidden_import(tmp_path):
    """The rule above is not blind: a wing module that imports a client module, or a third-party one,
    at its top is named; the same imports inside a function are not."""
    for i, (line, named) in enumerate((("from launcher.targets.local import payload", "launcher.targets.local.payload"),
                        ("import yaml", "yaml"), ("import launcher.core.errors", "launcher.core.errors"),
                        ("from launcher.targets.shared import logtail", "launcher.targets.shared.logtail"),
                        ("from launcher.targets.slurm.job import node", "launcher.targets.slurm.job.node"))):
        source = tmp_path / f"m{i}.py"  # a new file each time: modules are parsed once per path
        source.write_text(f"import os\n{line}\nfrom launcher.targets.shared import heartbeat\n"
                          "from launcher.targets.local.job import cgroups\n\n\ndef f():\n    import pydantic\n")
        assert in_job_wrong({"launcher.targets.local.job.m": source}) == [f"launcher.targets.local.job.m -> {named}"]


# One skeleton per target (issue 35 item 3): the same module names in every target, each holding the same part.
SKELETON = ("__init__.py", "options.py", "payload.py", "status.py", "target.py", "job/__init__.py")


def skeleton_wrong(root: Path) -> list[str]:
    wrong = [f"{name}/{part} is missing" for name in TARGET_NAMES for part in SKELETON if not (root / name / part).is_file()]
    for name in TARGET_NAMES:
        if (root / name / "payload.py").is_file() and (root / name / "target.py").is_file():
            classes = {n.name for n in ast.parse((root / name / "payload.py").read_text()).body if isinstance(n, ast.ClassDef)}
            bases = [ast.unparse(b) for n in ast.parse((root / name / "target.py").read_text()).body
                     if isinstance(n, ast.ClassDef) for b in n.bases if ast.unparse(b).startswith("Target[")]
            held = re.findall(r"\w+", bases[0].removeprefix("Target[")) if len(bases) == 1 else []
            if len(held) != 2 or not set(held) <= classes:
                wrong.append(f"{name}/target.py's Target[Payload, Handle] is not of classes of {name}/payload.py")
        if (root / name / "status.py").is_file() and (root / name / "target.py").is_file():
            tree = ast.parse((root / name / "status.py").read_text())
            if "job_status" not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
                wrong.append(f"{name}/status.py defines no job_status")
            calls = _calls(root / name / "target.py", "status")
            if "self.status_many" in calls:  # Slurm asks for all its jobs at once
                calls |= _calls(root / name / "target.py", "status_many")
            if "job_status" not in calls:
                wrong.append(f"{name}/target.py's status does not call status.job_status")
    return wrong


def _calls(path: Path, method: str) -> set[str]:
    """What the target class's ``method`` calls, by name."""
    return {ast.unparse(c.func) for cls in ast.parse(path.read_text()).body if isinstance(cls, ast.ClassDef)
            for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method
            for c in ast.walk(node) if isinstance(c, ast.Call)}


def test_every_target_has_the_same_skeleton():
    assert skeleton_wrong(PKG / "targets") == []


def test_the_skeleton_check_finds_a_missing_or_misplaced_part(tmp_path):
    for name in TARGET_NAMES:
        for part in SKELETON:
            (tmp_path / name / part).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / part).write_text((PKG / "targets" / name / part).read_text())
    assert skeleton_wrong(tmp_path) == []
    (tmp_path / "slurm" / "payload.py").rename(tmp_path / "slurm" / "script.py")
    (tmp_path / "k8s" / "job" / "__init__.py").unlink()
    (tmp_path / "local" / "payload.py").write_text("class LocalPayload:\n    pass\n")
    (tmp_path / "k8s" / "status.py").write_text("def status_of(handle):\n    pass\n")
    target = tmp_path / "local" / "target.py"
    target.write_text(target.read_text().replace("return job_status(handle)", "return read_state(handle)"))
    assert skeleton_wrong(tmp_path) == ["slurm/payload.py is missing", "k8s/job/__init__.py is missing",
                                        "local/target.py's Target[Payload, Handle] is not of classes of local/payload.py",
                                        "local/target.py's status does not call status.job_status",
                                        "k8s/status.py defines no job_status"]


K8S_ROOMS = ("objects", "validation", "cluster")


def k8s_rooms_wrong(root: Path, modules: dict[str, Path]) -> list[str]:
    """Kubernetes in three rooms (issue 35 item 3): beside the skeleton its modules are in
    ``objects/``, ``validation/`` or ``cluster/``, and the objects (pure) import nothing of the cluster room."""
    loose = sorted(p.name for p in root.glob("*.py") if p.name not in SKELETON)
    wrong = [f"k8s/{name} is in no room ({', '.join(K8S_ROOMS)})" for name in loose]
    wrong += [f"{name} -> {m}" for name, path in sorted(modules.items()) if name.startswith("launcher.targets.k8s.objects")
              for m in sorted(imports(path, top_level_only=False, by_type=True)) if m.startswith("launcher.targets.k8s.cluster")]
    return wrong


def test_kubernetes_is_in_three_rooms(tmp_path):
    k8s = PKG / "targets" / "k8s"
    assert sorted(p.name for p in k8s.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted([*K8S_ROOMS, "job"])
    assert k8s_rooms_wrong(k8s, MODULES) == []
    (tmp_path / "watch.py").write_text("")
    bad = tmp_path / "render.py"
    bad.write_text("def f():\n    from launcher.targets.k8s.cluster import pods\n")
    assert k8s_rooms_wrong(tmp_path, {"launcher.targets.k8s.objects.render": bad}) == [
        "k8s/render.py is in no room (objects, validation, cluster)",
        "k8s/watch.py is in no room (objects, validation, cluster)",
        "launcher.targets.k8s.objects.render -> launcher.targets.k8s.cluster.pods"]
