"""Targets as plugins (issue 46 item 4): a target from a package of its own, found through the entry-point
group ``ddpjob.targets`` (``launcher.core.plugins``), works end to end without a file of ddpjob changed.

The real test builds ``tests/foundation/plugin_echo`` into a wheel here (a wheel is a zip with its
dist-info: what any build backend writes), installs it with pip into a folder of its own and puts that
folder on ``PYTHONPATH``, as a user's ``pip install ddpjob-echo`` would put it in site-packages; then it
submits, renders, lists, follows and reads the docs of a job on ``--target echo`` with ddpjob's own
command line. The pure tests hold the reader of entry points and what a broken plugin says.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launcher.core import plugins

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "plugin_echo"
DDPJOB = Path(sys.executable).parent / "ddpjob"  # the installed console script: what users run


def build_wheel(out: Path, entry_points: str = "[ddpjob.targets]\necho = ddpjob_echo.options:TARGET\n") -> Path:
    """``ddpjob_echo-0.1-py3-none-any.whl`` from ``plugin_echo/``, with its RECORD's hashes."""
    dist = "ddpjob_echo-0.1.dist-info"
    files = {str(p.relative_to(SOURCE)): p.read_bytes() for p in sorted(SOURCE.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts}
    files[f"{dist}/METADATA"] = b"Metadata-Version: 2.1\nName: ddpjob-echo\nVersion: 0.1\nRequires-Dist: ddpjob\n"
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: ddpjob-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist}/entry_points.txt"] = entry_points.encode()

    def record(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}\n"

    files[f"{dist}/RECORD"] = ("".join(record(n, d) for n, d in files.items()) + f"{dist}/RECORD,,\n").encode()
    wheel = out / "ddpjob_echo-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def pip_install(wheel: Path, into: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(into), str(wheel)], check=True, capture_output=True, text=True, timeout=120)


@pytest.mark.real
def test_a_target_from_a_wheel_works_end_to_end_without_touching_ddpjob(tmp_path, ddpjob_home):
    site = tmp_path / "site"
    pip_install(build_wheel(tmp_path), site)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def ddpjob(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(DDPJOB), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    spec = tmp_path / "hi.yaml"
    spec.write_text("name: hi\ncommand: [python, -c, 'print(\"from the job\")']\necho:\n  greeting: hey there\n")
    assert "echo" in ddpjob("submit", "--help").stdout  # --target's choices
    shown = ddpjob("render", str(spec), "--target", "echo")
    assert shown.returncode == 0 and "# echo target" in shown.stdout and "echo hey there" in shown.stdout, shown
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: hi\ncommand: [python]\necho:\n  greting: x\n")
    bad = ddpjob("validate", str(typo), "--target", "local")  # its section is part of every spec
    assert bad.returncode == 2 and "typo.yaml:4" in bad.stderr and "greeting" in bad.stderr, bad
    sub = ddpjob("submit", str(spec), "--target", "echo", "-q")
    assert sub.returncode == 0, sub
    job_id = sub.stdout.split()[-1]
    waited = ddpjob("wait", job_id, "--timeout", "60")
    assert waited.returncode == 0 and "SUCCEEDED" in waited.stdout, waited
    logs = ddpjob("logs", job_id).stdout
    assert "[echo] hey there" in logs and "[echo] from the job" in logs, logs
    listed = json.loads(ddpjob("list", "-o", "json").stdout)
    assert [(j["id"], j["target"], j["state"]) for j in listed] == [(job_id, "echo", "SUCCEEDED")], listed
    status = json.loads(ddpjob("status", job_id, "-o", "json").stdout)
    assert status["status"]["state"] == "SUCCEEDED" and status["handle"]["pid"] > 0, status
    # What it does not do (launcher.targets.capabilities): said, with the targets that do.
    stacks = ddpjob("stacks", job_id)
    assert stacks.returncode == 2 and "ddpjob stacks is not supported by the echo target (the local, slurm, k8s " \
        "targets can); look at a rank's last lines with ddpjob logs ID --rank R" in stacks.stderr, stacks
    server = ddpjob("submit", str(spec), "--target", "echo", "--dry-run=server")
    assert server.returncode == 2 and "the echo target has none: use --dry-run" in server.stderr, server
    page = ddpjob("docs", "echo")
    assert page.returncode == 0 and page.stdout.startswith("# The echo target"), page
    assert "echo" in ddpjob("docs").stdout and "ddpjob-echo" in ddpjob("docs").stdout
    schema = json.loads(ddpjob("schema").stdout)
    assert schema["properties"]["echo"]["description"] == "Options for --target echo (one process, here)."
    # Without the package, ddpjob knows no echo target and says which ones it has.
    gone = subprocess.run([str(DDPJOB), "submit", str(spec), "--target", "echo"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and "'echo' is not one of 'local', 'slurm', 'k8s'" in gone.stderr, gone


def test_the_reader_finds_entry_points_as_importlib_metadata_does(tmp_path):
    """Two folders on the path, a dist-info and an egg-info: the first distribution of a name counts,
    other groups are ignored, and a broken plugin is named with its package."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, info, text in ((first, "My_Plugin-1.0.dist-info", "[ddpjob.targets]\nmine = mine.opts:TARGET\n"
                                "[console_scripts]\nx = y:z\n"),
                               (second, "my_plugin-2.0.dist-info", "[ddpjob.targets]\nold = old:TARGET\n"),
                               (second, "other.egg-info", "# a comment\n[ddpjob.targets]\n  theirs =  t.o:T  \n")):
        (folder / info).mkdir(parents=True)
        (folder / info / "entry_points.txt").write_text(text)
    found = plugins.scan([str(first), str(second), str(tmp_path / "missing")])
    assert found == [plugins.Registered("mine", "mine.opts:TARGET", "my-plugin"),
                     plugins.Registered("theirs", "t.o:T", "other")]


def test_a_broken_plugin_is_named_and_the_others_still_work(monkeypatch):
    """A registered target whose module cannot be imported (or names no TargetPlugin) does not stop the
    other targets: using it says which package's entry point failed and why."""
    from launcher.targets import lookup

    found = {**{n: plugins.Registered(n, r, "ddpjob") for n, r in plugins.BUILTIN.items()},
             "gone": plugins.Registered("gone", "no_such_module_here:TARGET", "ddpjob-gone"),
             "odd": plugins.Registered("odd", "launcher.core.plugins:GROUP", "ddpjob-odd"),
             "ghost": plugins.Registered("ghost", "ghost_plugin:TARGET", "ddpjob-ghost")}
    import types

    from launcher.targets.local.options import LocalOptions

    ghost = types.ModuleType("ghost_plugin")
    ghost.TARGET = plugins.TargetPlugin("no_such_ghost_target:GhostTarget", LocalOptions, "x")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ghost_plugin", ghost)
    monkeypatch.setattr(plugins, "registered", lambda: found)
    monkeypatch.setattr(lookup, "registered", lambda: found)
    plugins.plugin.cache_clear()
    with pytest.raises(plugins.PluginError, match=r"entry point 'no_such_module_here:TARGET' of the ddpjob-gone "
                       r"distribution.*cannot be imported: No module named 'no_such_module_here'"):
        plugins.plugin("gone")
    with pytest.raises(plugins.PluginError, match=r"names str, not a launcher\.core\.plugins\.TargetPlugin"):
        plugins.plugin("odd")
    from launcher.core.errors import TargetUnavailable

    with pytest.raises(TargetUnavailable, match="ddpjob-gone"):
        lookup.target_class("gone")
    with pytest.raises(TargetUnavailable, match=r"the ghost target's class no_such_ghost_target:GhostTarget cannot "
                       r"be imported: No module named 'no_such_ghost_target'"):
        lookup.target_class("ghost")
    assert lookup.target_class("local").__name__ == "LocalTarget"
    plugins.plugin.cache_clear()
