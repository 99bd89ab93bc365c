"""The picture ``ddpjob plot`` draws, with matplotlib (the ``plot`` extra). Imported only by that
command's body: never at the command line's start-up."""

from __future__ import annotations

import os

from launcher.core.errors import TargetUnavailable
from launcher.core.home import user_umask

EXTRA_HINT = "ddpjob plot needs matplotlib: pip install 'ddpjob[plot]'"


def need_matplotlib() -> None:
    """Raises ``TargetUnavailable`` (exit 3: this machine lacks it) naming the extra to install."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise TargetUnavailable(EXTRA_HINT) from e


def draw(curves: list[tuple[str, list[tuple[int, float]]]], metric: str, title: str, path: str, *,
         log_y: bool = False) -> None:
    """One line per ``(label, [(step, value)])``, each in its own colour, with a legend; written to
    ``path`` (its suffix gives the format: png, svg or pdf). ``log_y``: a logarithmic y axis."""
    from matplotlib import colormaps, rc_context
    from matplotlib.figure import Figure

    # Ten runs or fewer: the tab10 cycle (distinct for people and for tests); more: spread over a colour map.
    count = len(curves)
    colours = ([colormaps["tab10"](i) for i in range(count)] if count <= 10  # an int picks the i-th colour
               else [colormaps["turbo"](i / (count - 1)) for i in range(count)])
    # Text stays text in an SVG (searchable, and readable by a test), not outlines.
    with rc_context({"svg.fonttype": "none"}):
        fig = Figure(figsize=(8, 5), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        for (label, points), colour in zip(curves, colours):
            ax.plot([s for s, _ in points], [v for _, v in points], label=label, color=colour, linewidth=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        fig.savefig(path)
    # ddpjob runs with umask 077 (its records may hold secrets); a plot holds none and is made to be
    # shown: readable by others as the user's own files are (0644 less what their umask takes away).
    os.chmod(path, 0o644 & ~user_umask())
