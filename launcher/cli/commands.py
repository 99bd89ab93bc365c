"""The commands beyond a job's life cycle, each in its own module; ``main`` adds every one listed
here: completion, rm, prune, doctor, init (``tools``), config (``config``), results and plot
(``results``), rerun (``rerun``), list and cancel (``queue``), top (``top``), stacks (``stacks``), the
dashboard (``ui``), the reference pages (``docs``). Each imports only click at start-up."""

from __future__ import annotations

from launcher.cli.config import config_group
from launcher.cli.docs import docs
from launcher.cli.queue import cancel, list_
from launcher.cli.rerun import rerun
from launcher.cli.results import COMMANDS as RESULT_COMMANDS
from launcher.cli.stacks import stacks
from launcher.cli.tools import TOOLS
from launcher.cli.top import top
from launcher.cli.ui import ui

COMMANDS = (*TOOLS, config_group, *RESULT_COMMANDS, rerun, list_, cancel, top, stacks, ui, docs)
