"""Values ddpjob treats as secret that a build would put into the image.

What is secret is decided in one place, ``launcher.spec.secrets`` (the rule that keeps such values
out of a PyTorchJob and shows them as ``***``): the env values of secret-looking names, and the
notify URL. A build is refused (``SpecError``, exit 2, nothing built or pushed) when the spec file
it is made from goes into the image holding one (named at its line), or when any file going in
holds one of this spec's values (searched while the context is hashed; values shorter than
``MIN_SEARCHED`` are not, they would match ordinary text).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import Issue
from launcher.spec.secrets import is_secret, printable

if TYPE_CHECKING:
    from launcher.service.imagebuild.context import Context
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec

MIN_SEARCHED = 6
# Where a secret value lives instead of a file in the context.
_KEEP = {"env": "env_from_host: or an --env-file outside the context", "notify.url": "--notify-url when you submit"}


def secret_values(spec: JobSpec) -> dict[str, str]:
    """``field -> value`` for each value of ``spec`` that ddpjob treats as secret (``env.NAME``, ``notify.url``)."""
    out = {f"env.{name}": str(value) for name, value in spec.env.items() if is_secret(name, value) and str(value)}
    if spec.notify is not None and spec.notify.url:
        out["notify.url"] = spec.notify.url
    return out


def needles(spec: JobSpec) -> dict[str, bytes]:
    """The values ``context.scan`` looks for in the files that go in."""
    return {f: v.encode("utf-8", "surrogateescape") for f, v in secret_values(spec).items() if len(v) >= MIN_SEARCHED}


def spec_in_image(loaded: LoadedSpec, ctx: Context) -> str | None:
    """The spec file's path in the context when it goes into the image, else None."""
    if loaded.file is None or not os.path.isfile(loaded.file):
        return None
    path = Path(loaded.file).resolve()
    if not path.is_relative_to(ctx.root):
        return None
    rel = path.relative_to(ctx.root).as_posix()
    return rel if any(e.rel == rel and e.kind == "f" for e in ctx.entries) else None


def issues(loaded: LoadedSpec, ctx: Context) -> list[Issue]:
    """Why the image would hold a secret value: the spec file's own secret fields at their lines,
    then every other file (or field) holding one of the spec's values."""
    ignore = ctx.ignore_file or ".ddpjobignore"
    out: list[Issue] = []
    rel = spec_in_image(loaded, ctx)
    named: set[str] = set()
    if rel is not None:
        assert loaded.file is not None
        for field, line in _secret_fields(loaded.file):
            named.add(field)
            out.append(Issue(_path(field), f"is a secret value, and this spec file goes into the image (context "
                             f"{ctx.root}), where anyone who can pull the image can read it",
                             hint=_hint(field, rel, ctx.root, ignore), source=line))
    for holder, field in ctx.holding:
        if holder == rel and field in named:
            continue
        out.append(Issue(_path(field), f"its value is written in {printable(str(ctx.root / holder))}, which goes "
                         "into the image, where anyone who can pull the image can read it",
                         hint=f"remove the value from {printable(holder)} (keep it in {_KEEP.get(field, _KEEP['env'])}), "
                         f"or leave {printable(holder)} out with a line in {ignore}"))
    return out


def _secret_fields(file: str) -> list[tuple[str, str]]:
    """(field, ``FILE:LINE:COL``) of each secret value written in the spec file itself."""
    from launcher.spec import yamlread

    data, locations, _ = yamlread.parse(yamlread.read_spec_text(file), file)
    data = data if isinstance(data, dict) else {}
    env, notify = data.get("env"), data.get("notify")
    found: list[tuple[str, ...]] = []
    if isinstance(env, dict):
        found += [("env", str(k)) for k, v in env.items() if is_secret(str(k), v) and _written(v)]
    if isinstance(notify, dict) and _written(notify.get("url")):
        found.append(("notify", "url"))
    out = []
    for path in found:
        line, col = locations.get(path, locations.get((), (1, 1)))
        out.append((".".join(path), f"{printable(file)}:{line}:{col}"))
    return out


def _written(value: object) -> bool:
    return value is not None and str(value) != ""


def _path(field: str) -> tuple[str | int, ...]:
    head, _, rest = field.partition(".")
    return (head, rest)


def _hint(field: str, rel: str, root: Path, ignore: str) -> str:
    leave = f"or leave {printable(rel)} out with a line in {ignore}"
    if field == "notify.url":
        return f"give the URL when you submit (--notify-url URL), not in a file in the context; {leave}"
    name = field.partition(".")[2]
    return (f"take the value out of the context: env_from_host: [{name}] and export it where you submit "
            f"(Kubernetes: k8s.env_refs), or --env-file with a file outside {printable(str(root))}; {leave}")
