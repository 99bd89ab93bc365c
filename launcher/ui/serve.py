"""Run the dashboard: bind the socket first (so a busy port is a clear error before anything
starts, and ``--port 0`` learns the port the system chose), then hand it to uvicorn."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core.errors import TargetUnavailable, UsageError
from launcher.ui.extra import check_installed
from launcher.ui.guard import WILDCARDS, allowed_hosts, is_loopback, new_token, url_host

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs

RISK = ("listening on {host}, not on this machine's loopback: anyone who can reach {host}:{port} and learns the "
        "token (it is in the URL: browser history, shared screens, proxies' logs) can read your jobs' logs and "
        "specs and cancel your jobs, and the traffic is plain HTTP, not encrypted. Safer: keep the default "
        "(127.0.0.1) and reach it through SSH: ssh -L {port}:127.0.0.1:{port} THIS_HOST")


@dataclass
class Dashboard:
    """A bound, not yet serving dashboard: ``url`` (with the token) is what the user opens."""

    sock: socket.socket
    url: str
    token: str
    risk: str | None
    run: Callable[[], None]


def risk(host: str, port: int) -> str | None:
    """What listening on ``host`` exposes (None for loopback), said before the dashboard starts."""
    return None if is_loopback(host) else RISK.format(host=url_host(host or "0.0.0.0"), port=port)


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: not an address of this machine ({e.strerror})") from e
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--host {host}: not an address of this machine ({e.strerror})") from e
        raise TargetUnavailable(f"cannot listen on {url_host(host)}:{port}: {e.strerror}"
                                + ("; another program uses that port: give another with --port (0: any free one)"
                                   if e.errno == errno.EADDRINUSE else "")) from e
    return sock


def prepare(jobs: Jobs, host: str, port: int) -> Dashboard:
    """Bind ``host``:``port`` and build the app with a fresh token; ``run()`` serves until Ctrl-C."""
    check_installed()
    import uvicorn

    from launcher.ui.app import create_app

    sock = bind(host, port)
    actual = int(sock.getsockname()[1])
    token = new_token()
    app = create_app(jobs, token, allowed_hosts(host, actual), actual)
    shown = socket.gethostname() if host in WILDCARDS else host
    url = f"http://{url_host(shown)}:{actual}/?token={token}"
    # No access log: every request's URL carries the token, and the terminal is not the place for it.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           server_header=False, timeout_graceful_shutdown=5))

    def run() -> None:
        with sock:
            server.run(sockets=[sock])

    return Dashboard(sock, url, token, risk(host, actual), run)
