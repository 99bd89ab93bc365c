"""What the content scan (``secretscan``) found, as the build's answer: the findings the spec's
``build.allow_secrets`` does not accept become problems (``SpecError``, exit 2, before anything is
built or pushed), each ``file:line kind value-masked`` with the two ways on; the files it did not
read are said in one line."""

from __future__ import annotations

from collections.abc import Iterable

from launcher.core.errors import Issue
from launcher.service.imagebuild.secretscan import ALLOW_MARKS, TOO_LARGE, Finding

MAX_NAMED = 5  # unscanned files named in the one line


def unaccepted(findings: Iterable[Finding], allow: Iterable[str]) -> list[Finding]:
    """``findings`` less those ``allow`` accepts (``path`` for the whole file, ``path:line`` for one line)."""
    accepted = {a.strip().removeprefix("./") for a in allow}
    return [f for f in findings if f.rel not in accepted and f.where not in accepted]


def issues(findings: list[Finding], ignore_file: str | None, skip: str | None = None) -> list[Issue]:
    """One problem per finding (``skip``: the spec being built, whose own secret values
    ``secretvalues`` names at their fields), the way on after the last."""
    shown = [f for f in findings if not (f.rel == skip and f.kind.endswith("ddpjob spec"))]
    out = [Issue((), f"{f.kind} {f.masked} would go into the image, where anyone who can pull it can read it",
                 source=f.where) for f in shown]
    if out:
        first = shown[0]
        mark = ALLOW_MARKS[0].decode()
        out[-1] = Issue((), out[-1].message, source=out[-1].source, hint=(
            f"move the value out of the file (env_from_host:, or an --env-file outside the context), or leave the file "
            f"out with a line in {ignore_file or '.ddpjobignore'} ({first.rel}); or accept it: '# {mark}' (or "
            f"'pragma: allowlist secret') at the end of the line, or build.allow_secrets: [{first.where}] in the spec"))
    return out


def unscanned_line(unscanned: list[tuple[str, str]]) -> str:
    """The one line naming the files the scan did not read ("" when it read them all)."""
    if not unscanned:
        return ""
    big = [rel for rel, why in unscanned if why != "binary"]
    binary = len(unscanned) - len(big)
    parts = []
    if big:
        named = ", ".join(big[:MAX_NAMED]) + (", ..." if len(big) > MAX_NAMED else "")
        parts.append(f"{len(big)} {TOO_LARGE} ({named})")
    if binary:
        parts.append(f"{binary} binary")
    return f"not scanned for secrets: {' and '.join(parts)} file{'s' * (len(unscanned) != 1)}; --list names them"
