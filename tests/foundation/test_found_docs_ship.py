"""Docs that ship (issue 45 item 4): a ddpjob installed from a wheel has no clone beside it, so the pages
``ddpjob docs`` prints may link only to files the wheel holds, and every repository file that a message
names (``k8s/rbac.yaml``, ``k8s/README.md``...) ships too, where ``ddpjob docs NAME --path`` finds it.

The package mirrors the repository one level down: ``launcher/docs`` is ``docs/``, ``launcher/k8s`` is
``k8s/`` (links in a clone, files in the wheel), so a page's relative link such as ``../k8s/README.md``
means the same file in both. The pure tests read pyproject's package-data globs over the source tree (what
setuptools picks); the real one builds the wheel, installs it into an empty folder and reads that."""

from __future__ import annotations

import ast
import glob
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner
from testkit import walked

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "launcher"
# Scripts that work only in a clone: they build the training image from its Dockerfile with the source tree
# as the build context, which a wheel does not hold. The hints that name them are for a clone's user; what
# they do is in docker/README.md, which ships.
CLONE_ONLY = {"docker/build.sh", "docker/engine.sh"}
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|\b(?:src|href)=\"([^\"]+)\"")


def package_data() -> list[str]:
    """pyproject's package-data patterns for the ``launcher`` package."""
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns: list[str] = data["tool"]["setuptools"]["package-data"]["launcher"]
    return patterns


def shipped_from_source() -> dict[str, Path]:
    """Wheel name (``launcher/...``) -> source file, for every file the package-data globs pick. Like
    setuptools, the globs go through the links under launcher/ (launcher/docs -> ../docs)."""
    out = {}
    for pattern in package_data():
        for found in glob.glob(str(PKG / pattern)):
            if os.path.isfile(found):
                out[f"launcher/{Path(found).relative_to(PKG).as_posix()}"] = Path(found)
    return out


def headings(text: str) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub makes them (the rule test_found_docs uses)."""
    return {re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-") for h in text.splitlines() if h.startswith("#")}


def dead_links(files: Mapping[str, str | None]) -> list[str]:
    """Every relative link of every Markdown file in ``files`` (wheel name -> its text, None for a file
    that is not text) that names no file in ``files``, or no heading of the page it names. Links to a
    web page, a mail address or a heading of the same page are not files; links in code blocks are not links."""
    bad = []
    for name, text in sorted(files.items()):
        if not name.endswith(".md") or text is None:
            continue
        for m in LINK.finditer(re.sub(r"```.*?```", "", text, flags=re.S)):
            target = m.group(1) or m.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file, _, anchor = target.partition("#")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), file))
            if resolved not in files:
                bad.append(f"{name}: {target} (not in the wheel)")
            elif anchor and resolved.endswith(".md") and anchor not in headings(files[resolved] or ""):
                bad.append(f"{name}: {target} (no such heading)")
    return bad


def docstrings(nodes: Iterable[ast.AST]) -> set[int]:
    """The ids of the module's, its classes' and its functions' docstrings (of ``nodes``, every node of
    a module): they explain, they do not tell."""
    out = set()
    for node in nodes:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def texts(path: Path) -> list[str]:
    """The strings of a module (an f-string as one text, ``{}`` for each value), docstrings left out."""
    nodes = walked(path)  # ast.walk of the module's tree, kept for the other tests that read launcher/
    skip = docstrings(nodes)
    out = []
    for node in nodes:
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
            skip.update(id(v) for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out.append(node.value)
    return out


def repository_files_named() -> dict[str, list[tuple[str, str]]]:
    """Repository files outside launcher/ (``k8s/rbac.yaml``) that the strings of launcher/ name ->
    [(module, the string)]. A name is a relative path with a folder that is a file of this repository."""
    found: dict[str, list[tuple[str, str]]] = {}
    for module in sorted(PKG.rglob("*.py")):
        for text in texts(module):
            for word in set(re.findall(r"(?<![\w./~$-])(?:[\w-]+/)+[\w.-]*\w", text)):
                path = REPO / word
                if word.split("/", 1)[0] not in ("launcher", "tests") and path.is_file():
                    found.setdefault(word, []).append((str(module.relative_to(REPO)), text))
    return found


def wheel_name(repo_path: str) -> str:
    """Where a repository file is in the package: jobs/x.yaml is launcher/examples/x.yaml (jobs/ is the
    link), any other X is launcher/X (launcher/k8s is the link to k8s/)."""
    real = (REPO / repo_path).resolve().relative_to(REPO.resolve()).as_posix()
    return real if real.startswith("launcher/") else f"launcher/{repo_path}"


# --------------------------------------------------------------------------- pure: the source tree's globs

def test_no_shipped_page_links_a_file_that_does_not_ship() -> None:
    shipped = shipped_from_source()
    assert {"launcher/docs/targets.md", "launcher/docs/commands.md"} <= shipped.keys(), sorted(shipped)
    files = {name: src.read_text() if name.endswith(".md") else None for name, src in shipped.items()}
    assert dead_links(files) == []


def test_the_link_check_sees_a_dead_link_and_a_missing_heading() -> None:
    pages = {"launcher/docs/a.md": "# A\n[k](../k8s/README.md) [p](p.png) [h](b.md#nope) [w](https://x.org/y.md)\n"
                                   "```\n[code](not/a/link.md)\n```\n[s](#a) ![i](<b.md> \"t\")",
             "launcher/docs/b.md": "# B\n", "launcher/docs/p.png": None}
    assert dead_links(pages) == ["launcher/docs/a.md: ../k8s/README.md (not in the wheel)",
                                 "launcher/docs/a.md: b.md#nope (no such heading)"]


def test_every_file_a_message_names_ships() -> None:
    """What a message tells the user to read or apply is in the wheel (CLONE_ONLY aside: scripts that
    need a clone, named as the clone's tools)."""
    named = repository_files_named()
    assert {"k8s/rbac.yaml", "k8s/README.md"} <= named.keys(), sorted(named)
    shipped = shipped_from_source()
    missing = {f: [m for m, _ in where] for f, where in named.items()
               if f not in CLONE_ONLY and wheel_name(f) not in shipped}
    assert missing == {}, missing
    assert named.keys() >= CLONE_ONLY, "a script no message names any more: drop it from CLONE_ONLY"


def test_a_message_that_names_a_shipped_file_says_how_to_open_it() -> None:
    """A pip user has no k8s/ folder: the Kubernetes target's messages add ``ddpjob docs FILE``, which
    prints the installed file (``--path``: where it is)."""
    unreachable = [(module, text) for f, where in repository_files_named().items() if f not in CLONE_ONLY
                   for module, text in where
                   if module.startswith("launcher/targets/") and f"ddpjob docs {f}" not in text]
    assert unreachable == []


def test_ddpjob_docs_lists_prints_and_locates_every_file_the_pages_link() -> None:
    from launcher.cli.docs import LINKED
    from launcher.cli.main import cli

    runner = CliRunner()
    listing = runner.invoke(cli, ["docs"], catch_exceptions=False).stdout
    linked = sorted(name.removeprefix("launcher/") for name in shipped_from_source()
                    if not name.startswith(("launcher/docs/", "launcher/examples/")))
    assert "k8s/rbac.yaml" in linked and "ARCHITECTURE.md" in linked, linked
    assert sorted(name for name, _ in LINKED) == linked  # what docs lists is what ships, and the other way round
    for name in linked:
        assert re.search(rf"^{re.escape(name)}\s", listing, re.M), (name, listing)
        printed = runner.invoke(cli, ["docs", name], catch_exceptions=False)
        assert printed.exit_code == 0 and printed.stdout == (REPO / name).read_text(), name
        path = runner.invoke(cli, ["docs", name, "--path"], catch_exceptions=False).stdout.strip()
        assert Path(path) == PKG / name and Path(path).resolve() == (REPO / name).resolve(), path


# --------------------------------------------------------------------------- real: the wheel, installed

def build_wheel(tmp_path: Path) -> Path:
    """The wheel pip builds from the project's files alone (a copy: no egg-info or build folder of an
    earlier install lends it files), links copied as links, as a clone has them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for rel in filter(None, listed):
        path, copy = REPO / rel, src / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            os.symlink(os.readlink(path), copy)
        elif path.is_file():
            shutil.copyfile(path, copy)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("ddpjob-*.whl")
    return wheel


@pytest.mark.real  # slow: builds the wheel with pip and installs it
def test_the_wheel_installed_in_an_empty_folder_has_no_dead_link(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist()}
        links = [n for n, i in infos.items() if stat.S_ISLNK(i.external_attr >> 16)]
        assert links == [], f"the wheel holds links, not files: {links}"
        files = {n: z.read(n).decode() if n.endswith(".md") else None for n in infos}
    assert dead_links(files) == []
    named = {wheel_name(f) for f in repository_files_named() if f not in CLONE_ONLY}
    assert "launcher/k8s/rbac.yaml" in named and named <= files.keys(), sorted(named - files.keys())
    assert shipped_from_source().keys() <= files.keys(), sorted(shipped_from_source().keys() - files.keys())

    # Installed into an empty folder and run from another: ddpjob docs finds every page and linked file there.
    site, empty = tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def docs(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "launcher", "docs", *args], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    names = [line.split()[0] for line in docs().splitlines() if line and not line.startswith(("ddpjob", " "))
             and not line.endswith(":")]
    assert "targets" in names and "k8s/rbac.yaml" in names, names
    installed = {}
    for name in names:
        path = Path(docs(name, "--path").strip())
        assert path.is_file() and not path.is_symlink() and path.is_relative_to(site), (name, path)
    for path in (site / "launcher").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(site).as_posix()
            installed[rel] = path.read_text() if rel.endswith(".md") else None
    assert dead_links(installed) == []
    assert (site / "launcher" / "k8s" / "rbac.yaml").read_text() == (REPO / "k8s" / "rbac.yaml").read_text()
