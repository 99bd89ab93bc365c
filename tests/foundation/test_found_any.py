"""Types all the way down (issue 46): ``Any`` is written in the package only where a comment on its
line says why (``# Any: ...``), and fewer than 60 times in all. JSON read from files and APIs is
``launcher.core.jsondata.JSON``, narrowed where it is read; ``mypy --disallow-any-explicit launcher``
lists what is left. Pure: one walk of the package's syntax trees."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from testkit import walked

REPO = Path(__file__).resolve().parents[2]
MOST = 60
_IN_TEXT = re.compile(r"\bAny\b")


def explicit_any(nodes: tuple[ast.AST, ...]) -> list[int]:
    """The lines of a module (its nodes, ``testkit.walked``: the parse other checks share) that write
    ``Any`` as a type: the name, ``typing.Any``, or inside a string annotation (a forward reference);
    the import line aside."""
    lines: set[int] = set()
    for node in nodes:
        if (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any"):
            lines.add(node.lineno)
        elif isinstance(node, (ast.arg, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef)):
            note = node.annotation if isinstance(node, (ast.arg, ast.AnnAssign)) else node.returns
            if isinstance(note, ast.Constant) and isinstance(note.value, str) and _IN_TEXT.search(note.value):
                lines.add(note.lineno)
    return sorted(lines)


def unexplained(path: Path) -> tuple[int, list[str]]:
    """(How many lines of ``path`` write ``Any``, those of them without ``# Any:`` saying why.)"""
    text = path.read_text(encoding="utf-8").splitlines()
    found = explicit_any(walked(path))
    return len(found), [f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{n}: {text[n - 1].strip()}" for n in found if "# Any:" not in text[n - 1]]


def test_every_any_in_the_package_says_why_and_there_are_few():
    total, silent = 0, []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        count, bare = unexplained(path)
        total += count
        silent += bare
    assert silent == [], "Any without a '# Any: why' comment on its line:\n" + "\n".join(silent)
    assert total < MOST, f"{total} lines write Any (fewer than {MOST}): type them (launcher.core.jsondata for JSON)"


def test_the_walk_finds_each_way_of_writing_any(tmp_path):
    """Not blind: the bare name, typing.Any, a string annotation; the reason comment clears a line."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import typing\nfrom typing import Any\n\n"
        "def f(x: Any) -> None: ...\n"
        "def g(x: typing.Any) -> None: ...\n"
        "def h(x: 'dict[str, Any]') -> None: ...\n"
        "def k(x: 'Any') -> 'Any': ...\n"
        "y: dict[str, Any] = {}  # Any: a third party's free-form values\n"
        "def ok(x: object, many: 'AnyStr') -> None: ...\n", encoding="utf-8")
    count, bare = unexplained(planted)
    assert count == 5 and [line.split(":")[1] for line in bare] == ["4", "5", "6", "7"], bare
