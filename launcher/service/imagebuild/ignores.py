"""The ignore files of a build context (``.ddpjobignore``, else ``.dockerignore``) and their syntax.

One pattern per line, ``#`` comments, ``*`` and ``?`` within one path segment, ``**`` across
segments, ``[...]`` classes, ``!`` to take a path back; the last matching line wins, and a pattern
that matches a folder leaves out everything in it. The secret-looking defaults
(``secretfiles``) are written in the same syntax, so a user's ``!`` line speaks their language.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".ddpjobignore", ".dockerignore")
# Without an ignore file: what never belongs in an image and changes on every commit or run.
DEFAULT_IGNORES = (".git", ".venv", "**/__pycache__", "**/*.pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache")


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    keep: bool  # a ``!`` line: the path is taken back


def translate(pattern: str) -> re.Pattern[str]:
    """One pattern (without ``!``, normalised) as a regular expression over ``a/b/c`` paths."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[" and (end := pattern.find("]", i + 1)) > i + 1:
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out, i = out + "[" + body.replace("\\", "\\\\") + "]", end + 1
        else:
            out, i = out + re.escape(c), i + 1
    return re.compile(out + r"\Z")


def parse_rules(text: str) -> list[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        line = line[1:].strip() if keep else line
        line = os.path.normpath(line.lstrip("/")) if line.lstrip("/") else ""
        if line and line != ".":
            rules.append(Rule(translate(line), keep))
    return rules


def prefixes(rel: str) -> list[str]:
    """``a/b/c`` -> ``a``, ``a/b``, ``a/b/c``: the path's folders, then the path."""
    parts = rel.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]


def excluded(rel: str, rules: list[Rule]) -> bool:
    """Whether ``rel`` (``a/b/c``) is left out: the last rule matching it or one of its folders."""
    paths = prefixes(rel)
    out = False
    for rule in rules:
        if any(rule.pattern.match(p) for p in paths):
            out = not rule.keep
    return out


def rules_of(root: Path) -> tuple[list[Rule], str | None]:
    """The context's rules and the ignore file they came from (None: ``DEFAULT_IGNORES``)."""
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            return parse_rules(path.read_text(errors="replace")), name
    return parse_rules("\n".join(DEFAULT_IGNORES)), None
