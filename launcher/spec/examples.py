"""The example specs shipped inside the package (``launcher/examples/*.yaml``; ``jobs/`` in a clone
links there), so that ``ddpjob init`` gives a pip-installed ddpjob the same starting points."""

from __future__ import annotations

import functools
import os

# launcher/examples/: package data beside this package (jobs/ in a clone links there).
_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@functools.cache
def names() -> tuple[str, ...]:
    """The examples' names (file names without ``.yaml``), quickstart first; read once."""
    try:
        found = sorted(f[:-5] for f in os.listdir(_DIR) if f.endswith(".yaml"))
    except OSError:
        return ()
    return tuple(sorted(found, key=lambda n: n != "quickstart"))


def text(name: str) -> str:
    """The example spec ``name`` as written in the package. ``KeyError`` for an unknown name."""
    if name not in names():
        raise KeyError(name)
    with open(os.path.join(_DIR, f"{name}.yaml"), encoding="utf-8") as f:
        return f.read()


def summary(spec_text: str) -> str:
    """An example's first comment line (what it is), without the ``#``."""
    lines = spec_text.splitlines()
    return lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""


def hint_for_missing(path: str) -> str | None:
    """For a spec path that does not exist but names an example (``jobs/quickstart.yaml`` run
    outside a clone), how to get that example here."""
    base = os.path.basename(path)
    name = base[:-5] if base.endswith(".yaml") else None
    if name is None or name not in names():
        return None
    return f"`ddpjob init {name}` writes this example spec to ./{name}.yaml"
