"""``ddpjob ui``: the local dashboard (``launcher.ui``). Imports only click at start-up; the web
framework is loaded by the command's body, and its absence is a message naming the extra."""

from __future__ import annotations

import sys

import click

from launcher.cli.support import guard


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0: any free port; the URL printed says which).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes your jobs to the network (said at start).")
@guard
def ui(port: int, host: str) -> None:
    """Open a dashboard of your jobs in the browser: the jobs table (state, progress, age, target), each
    job's runs and their curves, nodes and ranks, root cause, the last lines of every node's log, the
    spec (secrets masked), and a button to cancel. Pages follow running jobs live.

    It listens on 127.0.0.1 only and prints a URL with a random token: open that URL. Requests
    without the token, or addressed to another host name (DNS rebinding), get 403. Ctrl-C stops it.
    Needs the ui extra: pip install 'ddpjob[ui]'.

    \b
    Examples:
      ddpjob ui                      # then open the printed http://127.0.0.1:8765/?token=...
      ddpjob ui --port 0             # any free port
      ssh -L 8765:127.0.0.1:8765 gpu-box 'ddpjob ui'    # a remote machine's jobs, through SSH
    """
    from launcher.cli.specopts import jobs_service
    from launcher.ui.extra import check_installed

    check_installed()  # before launcher.ui.serve, whose imports need the extra
    from launcher.ui.serve import prepare

    dash = prepare(jobs_service(), host, port)
    if dash.risk:
        click.echo(f"warning: {dash.risk}", err=True)
    click.echo(f"ddpjob dashboard: {dash.url}")
    click.echo("  (the token in the URL is the key: do not share it; Ctrl-C stops the dashboard)")
    sys.stdout.flush()
    dash.run()
