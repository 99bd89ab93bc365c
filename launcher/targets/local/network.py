"""The job's own network on the local target (``local.network: bridge``, with ``local.container``):
each node's container has its own address, and node 0's is the rendezvous address.

- One network per job, named ``ddpjob-<job id>``: ``submit`` creates it with
  ``ENGINE network create --internal --subnet S --label ddpjob.job=<job id> ddpjob-<job id>``
  (the plan shows that exact command), the supervisor removes it when the job ends, and ``cancel``
  does too (after a supervisor that was killed before it could).
- ``--internal``: no route out of the network and no NAT. The containers reach each other and
  nothing else, so no packet of the job leaves this machine (a job that downloads needs ``host``).
- The subnet is a /24 of ``POOL`` that no route of this machine and no network of the engine
  overlaps: the first free one from a start derived from the job id, so jobs submitted together
  start their search at different places. Two submits racing for one subnet: the engine refuses
  the second network, and that submit says so (nothing is left behind).
- Node ``i`` has host address ``i + 2`` of the subnet (``.1`` is the engine's gateway address
  even on an internal network); torchrun's ``--master-addr`` is node 0's. The port stays the one
  chosen at submit: in its own network namespace no other program can take it.
- NCCL and Gloo use the container's interface (``eth0``) instead of the loopback defaults,
  unless the spec's ``nccl.socket_ifname`` names another.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.core.errors import Issue, SubmitRejected, TargetUnavailable

if TYPE_CHECKING:
    import subprocess

NETWORKS = ("host", "bridge")
POOL = "10.213.0.0/16"  # private (RFC 1918); podman picks 10.88-10.89 and docker 172.17+ by default
PREFIX = 24
MAX_NODES = 2**(32 - PREFIX) - 3  # less the network, gateway (.1) and broadcast addresses
IFNAME = "eth0"  # the interface both engines give a container on a bridge network
# NCCL/Gloo over the container's own interface, not the loopback (which no longer reaches the peers).
NCCL_IFACE = {"NCCL_SOCKET_IFNAME": IFNAME, "GLOO_SOCKET_IFNAME": IFNAME}
LABEL = "ddpjob.job"


def network_name(job_id: str) -> str:
    return f"ddpjob-{job_id}"


def plan_issues(network: str, engine: str, nodes: int) -> list[Issue]:
    """Spec problems of ``local.network``: bridge needs a container; one /24 holds so many nodes."""
    if network != "bridge":
        return []
    if engine == "none":
        return [Issue(("local", "network"), "local.network: bridge gives each node's container its own address, "
                      "and local.container is none", hint="set local.container: podman (or docker), or "
                      "local.network: host")]
    if nodes > MAX_NODES:
        return [Issue(("nodes",), f"local.network: bridge holds at most {MAX_NODES} nodes (one /{PREFIX})",
                      hint=f"use at most {MAX_NODES} nodes, or local.network: host")]
    return []


def pick_subnet(job_id: str, used: list[str]) -> str | None:
    """A /24 of ``POOL`` overlapping none of ``used`` (CIDR texts; others are ignored), searched
    from a start derived from ``job_id``; None when every one is taken."""
    import ipaddress  # here: a host-network plan (every render imports this module) never needs it
    import zlib

    taken = []
    for text in used:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network):
            taken.append(net)
    candidates = list(ipaddress.IPv4Network(POOL).subnets(new_prefix=PREFIX))
    start = zlib.crc32(job_id.encode()) % len(candidates)
    for k in range(len(candidates)):
        cand = candidates[(start + k) % len(candidates)]
        if not any(cand.overlaps(t) for t in taken):
            return str(cand)
    return None


def node_address(subnet: str, node: int) -> str:
    import ipaddress

    return str(ipaddress.IPv4Network(subnet)[node + 2])


def job_subnet(job_id: str, used: list[str], engine: str) -> str:
    """The job's subnet: free of this machine's routes and the engine's networks (``used``)."""
    subnet = pick_subnet(job_id, used)
    if subnet is None:
        raise TargetUnavailable(f"every /{PREFIX} of {POOL} overlaps a route or an engine network of this "
                                f"machine: local.network: bridge has no free subnet (remove unused networks: "
                                f"{engine} network prune)")
    return subnet


def create_job_network(argv: list[str], engine: str, name: str | None) -> None:
    """Make the job's network (``argv``: its ``create_argv``; none for ``host``) before any container
    needs it."""
    if not argv:
        return
    why = create(argv)
    if why is not None:
        raise SubmitRejected(f"{engine} could not create the job's network {name} ({' '.join(argv)}): {why}; "
                             "submit again (another subnet is chosen for a new job), or use local.network: host")


def create_argv(engine: str, name: str, subnet: str, job_id: str) -> list[str]:
    """The command that makes the job's network (podman and docker take the same words)."""
    return [engine, "network", "create", "--internal", "--subnet", subnet, "--label", f"{LABEL}={job_id}", name]


def host_name(node: int) -> str:
    """Node ``node``'s host name on the job's network."""
    return f"node{node}"


def run_args(name: str, addresses: list[str], node: int) -> list[str]:
    """What ``ENGINE run`` gets instead of ``--network=host``: node ``node``'s address and host name, and
    every node's name in its /etc/hosts. torch's rendezvous store (listening on IPv6 and IPv4 at once)
    looks up the name of each client that connects, as an IPv4-mapped IPv6 address (``::ffff:A.B.C.D``),
    and without an entry for that form warns ``The hostname of the client socket cannot be retrieved.
    err=-3`` on every connection (the job's network has no DNS to ask). Those entries name
    ``node<i>-v4mapped``, so that looking up ``node<i>`` still gives its IPv4 address alone."""
    args = ["--network", name, "--ip", addresses[node], "--hostname", host_name(node)]
    # Every IPv4 line first (its own too): glibc answers an IPv4 address from a mapped line that comes first.
    args += [a for n, address in enumerate(addresses) for a in ("--add-host", f"{host_name(n)}:{address}")]
    return args + [a for n, address in enumerate(addresses)
                   for a in ("--add-host", f"{host_name(n)}-v4mapped:::ffff:{address}")]


def _engine(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    import subprocess  # only when an engine is asked: render of a host-network plan never does

    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def host_routes(route_file: str = "/proc/net/route") -> list[str]:
    """The IPv4 destinations this machine routes (the default route left out), as CIDR texts."""
    import ipaddress

    out = []
    try:
        with open(route_file, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    for line in lines:
        cols = line.split()
        try:
            dest, mask = bytes.fromhex(cols[1])[::-1], bytes.fromhex(cols[7])[::-1]
            net = ipaddress.IPv4Network((int.from_bytes(dest, "big"), bin(int.from_bytes(mask, "big")).count("1")),
                                        strict=False)
        except (IndexError, ValueError):
            continue
        if net.prefixlen:
            out.append(str(net))
    return out


def engine_subnets(engine: str) -> list[str]:
    """Subnets of the engine's networks (podman's ``subnets``, docker's ``IPAM.Config``); none when
    the engine is missing or does not answer (creating the network then says what clashes)."""
    import json

    names = _engine([engine, "network", "ls", "-q"])
    if names is None or names.returncode != 0 or not names.stdout.split():
        return []
    proc = _engine([engine, "network", "inspect", *names.stdout.split()])
    try:
        nets = json.loads(proc.stdout) if proc is not None and proc.returncode == 0 else []
    except ValueError:
        return []
    out = []
    for n in nets if isinstance(nets, list) else []:
        if not isinstance(n, dict):
            continue
        for s in n.get("subnets") or []:
            out.append(str(s.get("subnet", "")))
        for s in (n.get("IPAM") or {}).get("Config") or []:
            out.append(str(s.get("Subnet", "")))
    return [s for s in out if s]


def used_subnets(engine: str) -> list[str]:
    """What a job's subnet must not overlap: this machine's routes and the engine's networks."""
    return sorted(set(host_routes()) | set(engine_subnets(engine)))


def create(argv: list[str]) -> str | None:
    """Run ``create_argv``'s command; None when the network was made, else the engine's reason."""
    proc = _engine(argv)
    if proc is None:
        return f"{argv[0]} could not be run"
    if proc.returncode != 0:
        return (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
    return None


def exists(engine: str, name: str) -> bool | None:
    """Whether the engine has the network ``name``; None when the engine cannot be asked."""
    proc = _engine([engine, "network", "ls", "--format", "{{.Name}}"])  # docker's -q prints ids
    if proc is None or proc.returncode != 0:
        return None
    return name in proc.stdout.split()


def remove(engine: str, name: str) -> bool:
    """Remove the network ``name`` (its containers were removed first); True when it is gone."""
    if exists(engine, name) is False:
        return True
    _engine([engine, "network", "rm", name], timeout=120)
    return exists(engine, name) is False


def remove_job_network(engine: str, name: str, containers: list[str], job_id: str) -> None:
    """The job's own network ``name`` (local.network: bridge), at the supervisor's end, once its
    ``containers`` are gone: the engine refuses to remove a network a container still uses, so any
    container the engine has not yet removed (--rm) goes first."""
    from launcher.targets.local import container
    from launcher.targets.local.job.statefile import say

    container.remove(engine, containers)
    if not remove(engine, name):
        say(f"[ddpjob] could not remove the network {name}: ddpjob cancel {job_id} tries again")
