"""Every command of ``ddpjob``, in one list (``COMMANDS``), which ``main`` adds to the group. A new
command is a click command in the module of its kind (or one of its own) and one entry here; each
module imports only click at start-up:

- a job's life: submit, render, validate, schema, status, logs, wait (``lifecycle``);
- list and cancel (``queue``), rerun (``rerun``), top (``top``), stacks (``stacks``);
- the tools: completion, rm, prune, doctor, init (``tools``), build (``buildcmd``), config (``config``);
- results, plot and compare (``results``), the dashboard (``ui``), the reference pages (``docs``).
"""

from __future__ import annotations

import click

from launcher.cli.buildcmd import build
from launcher.cli.config import config_group
from launcher.cli.docs import docs
from launcher.cli.lifecycle import logs, render, schema, status, submit, validate, wait
from launcher.cli.queue import cancel, list_
from launcher.cli.rerun import rerun
from launcher.cli.results import plot, results
from launcher.cli.stacks import stacks
from launcher.cli.tools import completion, doctor, init, prune, rm
from launcher.cli.top import top
from launcher.cli.ui import ui

COMMANDS: tuple[click.Command, ...] = (
    submit, render, validate, schema, status, logs, wait,  # a job's life
    list_, cancel, rerun, top, stacks,  # the jobs
    completion, rm, prune, doctor, init, build, config_group,  # the tools
    results, plot, ui, docs,  # results, the dashboard, the pages
)
