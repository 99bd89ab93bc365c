"""Who may talk to the dashboard: a request must carry the random token the server printed, and a
Host header naming the address it serves.

The token keeps out other users of this machine and web pages in the user's own browser (they
cannot read it). The Host check defeats DNS rebinding: a page from ``evil.example`` whose name is
made to resolve to 127.0.0.1 reaches the port, but its requests say ``Host: evil.example``. A
cancel is a POST (a link or an image cannot make one) and carries the token too.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket

from starlette.datastructures import Headers, MutableHeaders, QueryParams
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketClose

WILDCARDS = ("0.0.0.0", "::", "")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """``host`` as it is written in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _with_port(names: set[str], port: int) -> set[str]:
    out = {f"{url_host(n).lower()}:{port}" for n in names}
    if port == 80:  # browsers leave the default port out of the Host header
        out |= {url_host(n).lower() for n in names}
    return out


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host header values a request may carry when the server listens on ``host``:``port``.

    Loopback: that address and ``localhost``. A named address: that one. A wildcard (``0.0.0.0``,
    ``::``): None, meaning any IP address literal (no DNS name is involved, so nothing can be
    rebound) or this machine's own names (``allowed``)."""
    if host in WILDCARDS:
        return None
    names = {host}
    if is_loopback(host):
        names.add("localhost")
    return frozenset(_with_port(names, port))


def allowed(header: str, hosts: frozenset[str] | None, port: int) -> bool:
    """Whether a request's Host header is one the server answers."""
    value = header.strip().lower()
    if hosts is not None:
        return value in hosts
    if value.startswith("["):  # [::1]:8765
        name, _, rest = value[1:].partition("]")
        given = rest[1:] if rest.startswith(":") else ("80" if not rest else "")
    else:
        name, sep, given = value.partition(":")
        given = given if sep else "80"
    if given != str(port):
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return bool(name) and name in {socket.gethostname().lower(), socket.getfqdn().lower()}


class Guard:
    """ASGI middleware: 403 for a request without the token or with a Host header the server does not
    serve (and for a POST sent from another site's page); headers that keep the pages out of frames,
    the token out of Referer headers and every resource to the dashboard's own."""

    def __init__(self, app: ASGIApp, token: str, hosts: frozenset[str] | None, port: int) -> None:
        self.app, self.token, self.hosts, self.port = app, token, hosts, port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the dashboard has none: refuse rather than pass one on unchecked
            await WebSocketClose(code=1008)(scope, receive, send)
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = QueryParams(scope.get("query_string", b"")).get("token", "")
        origin = headers.get("origin")
        if not allowed(headers.get("host", ""), self.hosts, self.port):
            why = "this dashboard answers only requests addressed to the address it printed (Host header refused)"
        elif not secrets.compare_digest(given.encode(), self.token.encode()):
            why = "a token is needed: open the URL that `ddpjob ui` printed"
        elif scope.get("method") == "POST" and origin not in (None, "null") and not allowed(
                origin.split("://", 1)[-1], self.hosts, self.port):
            why = "a POST from another site's page is refused"
        else:
            await self.app(scope, receive, _secured(send))
            return
        await PlainTextResponse(f"403 Forbidden: {why}\n", status_code=403, headers=dict(SECURITY_HEADERS))(
            scope, receive, send)


def _secured(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS:
                headers[name] = value
        await send(message)

    return wrapped


SECURITY_HEADERS = (
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-store"),
    # Only what the dashboard serves itself: its own script and style, inline SVG.
    ("content-security-policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
)
