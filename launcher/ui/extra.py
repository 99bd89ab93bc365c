"""Whether the ui extra is installed: asked before anything of the dashboard that imports Starlette (its
modules do at their top), so that a missing extra is a message naming it, not an import error."""

from __future__ import annotations

from launcher.core.errors import TargetUnavailable

EXTRA_HINT = "the dashboard needs its web server: pip install 'ddpjob[ui]' (Starlette and uvicorn)"


def check_installed() -> None:
    """``TargetUnavailable`` (exit 3) naming the extra when Starlette or uvicorn cannot be imported."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise TargetUnavailable(f"{EXTRA_HINT}; here: {e}") from e
