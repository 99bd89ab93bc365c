"""This node's network interfaces, checked before torchrun starts. Standard library only (it runs
inside jobs, possibly in a container, and in the local node wrapper, which starts as ``python -I -S``).

NCCL and Gloo read the interface to use from ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME``. A
name that this node lacks ends, without this check, in Gloo's "Unable to find address for: nosuch0"
from every rank, or in a rendezvous timeout minutes later. ``check`` says it at once, naming the
node, what was asked for and the interfaces the node has.

The two variables take different forms. ``NCCL_SOCKET_IFNAME`` is a comma list of name prefixes,
``=`` before the list for exact names, ``^`` for names to leave out. ``GLOO_SOCKET_IFNAME`` is exact
names only (comma list). ``gloo_names`` turns an NCCL-style value into the exact names it selects
on this node, so one spec field serves both libraries on every node.
"""

from __future__ import annotations

# socket, fcntl, struct and ipaddress are imported where used: a local render imports this module
# (its plan checks a socket_ifname) but never looks at an interface (~1.5 ms of its start-up).

_SIOCGIFADDR = 0x8915  # Linux: the interface's (primary) IPv4 address


def interfaces() -> dict[str, str]:
    """{name: IPv4 address or ""} for every interface of this node (its network namespace)."""
    import fcntl
    import socket
    import struct

    out: dict[str, str] = {}
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                out[name] = socket.inet_ntoa(packed[20:24])
            except OSError:
                out[name] = ""  # up or down, but no IPv4 address
    return out


def describe(ifaces: dict[str, str]) -> str:
    """``eth0 10.1.2.3, lo 127.0.0.1`` then, if any, ``; without an IPv4 address: eth1``."""
    have = ", ".join(f"{n} {a}" for n, a in sorted(ifaces.items()) if a) or "no interface with an IPv4 address"
    bare = sorted(n for n, a in ifaces.items() if not a)
    return have + (f"; without an IPv4 address: {', '.join(bare)}" if bare else "")


def select(value: str, names: list[str]) -> list[str]:
    """The names an NCCL-style ``value`` selects among ``names`` (prefixes; ``=``: exact; ``^``: all but)."""
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    wanted = [w for w in (rest[1:] if exact else rest).split(",") if w]

    def hit(name: str) -> bool:
        return any(name == w if exact else name.startswith(w) for w in wanted)

    return [n for n in names if hit(n) != exclude]


def gloo_names(value: str, ifaces: dict[str, str]) -> list[str]:
    """The exact interface names for ``GLOO_SOCKET_IFNAME`` that ``value`` (NCCL form) selects here,
    only those with an IPv4 address; loopback is left out of an exclusion (``^docker``) unless it
    is all there is, as NCCL does."""
    names = [n for n, a in ifaces.items() if a]
    chosen = select(value, names)
    if value.startswith("^"):
        real = [n for n in chosen if not is_loopback(ifaces[n])]
        chosen = real or chosen
    return chosen


def check(env: dict[str, str], where: str, ifaces: dict[str, str] | None = None) -> tuple[dict[str, str], str | None]:
    """Check the interface variables in ``env`` against this node.

    Returns (the variables to set, an error or None). ``GLOO_SOCKET_IFNAME`` is rewritten to the
    exact names that an NCCL-style value selects here. ``where`` names the node in the error.
    """
    ifaces = interfaces() if ifaces is None else ifaces
    updates: dict[str, str] = {}
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = env.get(var, "")
        if not value:
            continue
        if var == "GLOO_SOCKET_IFNAME":
            chosen = gloo_names(value, ifaces)
            if chosen and ",".join(chosen) != value:
                updates[var] = ",".join(chosen)
        else:
            chosen = select(value, list(ifaces))
        if not chosen:
            return updates, (f"{where}: {var}={value} matches no interface with an address on this node; "
                             f"it has: {describe(ifaces)}. Set nccl.socket_ifname to one of them "
                             "(the same name on every node), or leave it unset")
    return updates, None


def route_to(host: str, port: int) -> tuple[str, str, str]:
    """(the address ``host`` resolves to here, this node's address toward it, its interface or "").

    Connecting a UDP socket sends nothing; it only asks the kernel which source address it would use.
    Raises OSError when the name does not resolve or no route leads there.
    """
    import socket

    target = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((target, port))
        own = sock.getsockname()[0]
    iface = next((n for n, a in interfaces().items() if a == own), "")
    return str(target), str(own), iface


def is_loopback(addr: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
