"""The local target's request: what ``plan`` builds, ``submit`` writes to ``plan.json`` and the
supervisor runs, its text (``plan.txt``, ``render``), and the handle ``submit`` returns. The
supervisor's quick start reads ``plan.json`` into namespaces; its typed paths (status, port moves)
use these dataclasses."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from launcher.core.errors import TargetError
from launcher.spec.secrets import shown_value
from launcher.targets.base import Handle
from launcher.targets.local import container as ctr
from launcher.targets.local import network as net
from launcher.targets.shared.files import from_json
from launcher.targets.shared.runfolder import PLAN, RunFolder

MARKER = "DDPJOB_JOB_ID"  # every process of a job carries it in its environment (see procs)
# What render and --dry-run show where the port chosen at submit will be.
PORT_AT_SUBMIT = "<port>"


@dataclass
class LocalNode:
    """One node of one run: the torchrun agent the supervisor starts."""

    node: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    error_file: str
    torchrun_log_dir: str
    container: str | None = None  # the container's name when the node runs in one (local.container)


@dataclass
class LocalElement:
    """One run (sweep element) and its nodes."""

    index: int
    params: dict[str, str]
    output_dir: str
    nodes: list[LocalNode]


@dataclass
class LocalPayload:
    """What the supervisor runs (``plan.json``). ``port`` is None until submit chooses it."""

    job_id: str
    run_dir: str
    nodes: int
    procs_per_node: int
    port: int | None
    stop_on_failure: bool
    elements: list[LocalElement]
    port_fixed: bool = False  # the spec's master_port: never moved when it is taken
    container: str = "none"  # local.container: the engine that runs each node, or none
    # The service's command for a new port when another program took this one (PlanContext.port_command).
    port_command: list[str] = field(default_factory=list)
    master_addr: str = "127.0.0.1"  # the rendezvous address: node 0's (local.network: bridge: its container's)
    # local.network: bridge: the job's own network, made at submit by ``network_create`` (see network.py).
    network_name: str | None = None
    network_create: list[str] = field(default_factory=list)
    gpu_note: str = ""  # the ranks share this machine's GPUs (targets.shared.dist.shared_gpus_note)
    threads_note: str = ""  # the processes' OpenMP threads outnumber this machine's cores (target.threads_note)
    max_losses: int = 0  # recovery.max_losses: lost nodes a run survives, each brought back by the supervisor


@dataclass
class LocalHandle(Handle):
    """The supervisor's pid and start time (a pid alone could be reused by another process)."""

    pid: int = 0
    start: int | None = None


def read_plan(run_dir: str) -> LocalPayload:
    """The payload ``submit`` wrote to ``plan.json``."""
    data = RunFolder(run_dir).read_plan()
    if data is None:
        raise TargetError(f"the run directory {run_dir} has no readable {PLAN} (was it deleted?)")
    return from_json(LocalPayload, data)


def render_local(payload: LocalPayload, masked: frozenset[str] = frozenset()) -> str:
    """Shell-equivalent text of the plan: one block per run and node, env sorted, every word quoted;
    the values of the env names in ``masked`` shown as ``***``."""
    if payload.port is None:
        rendezvous = (f"rendezvous {payload.master_addr}:{PORT_AT_SUBMIT} (a free port chosen at submit; "
                      "master_port: fixes it)")
    else:
        rendezvous = f"rendezvous {payload.master_addr}:{payload.port}"
    out = [
        f"# ddpjob local plan: job {payload.job_id}",
        f"# {payload.nodes} node(s) x {payload.procs_per_node} process(es), {rendezvous}, run dir {payload.run_dir}",
    ]
    if payload.container != "none":
        out.append(f"# each node runs in its own {payload.container} container, named below and removed at its end "
                   "and by cancel; the engine passes each variable named by --env from the env below")
    if payload.gpu_note:
        out.append(f"# note: {payload.gpu_note}")
    if payload.threads_note:
        out.append(f"# note: {payload.threads_note}")
    if payload.max_losses:
        out.append(f"# a lost node (its process killed from outside) brings the run back by itself, up to "
                   f"{payload.max_losses} time(s) (recovery.max_losses): every node started again with "
                   "DDPJOB_RESTART_COUNT set, the program resuming from its checkpoint")
    if payload.network_create:
        out.append("# each container has its own address (--ip) on the job's own internal network (nothing leaves "
                   f"this machine; a free /{net.PREFIX} of {net.POOL} chosen for the job's id), made at submit and "
                   "removed at the job's end and by cancel:")
        out.append(shlex.join(payload.network_create))
    for el in payload.elements:
        params = " ".join(f"{k}={v}" for k, v in el.params.items())
        out.append("")
        out.append(f"## task {el.index}" + (f" ({params})" if params else "") + f", output {el.output_dir}")
        for n in el.nodes:
            out.append(f"# node {n.node} -> {n.log}")
            env = " \\\n    ".join(f"{k}={shlex.quote(shown_value(k, v, masked))}" for k, v in n.env.items())
            cmd = ctr.shown(n.argv) if n.container else shlex.join(n.argv)
            out.append(f"(cd {shlex.quote(n.cwd)} && env \\\n    {env} \\\n  {cmd})")
    return "\n".join(out) + "\n"


def move_port(payload: LocalPayload, port: int) -> None:
    """Every node of every run meets on ``port`` from now on (the old one was taken)."""
    for el in payload.elements:
        for n in el.nodes:
            i = n.argv.index("--master-port")
            n.argv[i + 1] = str(port)
    payload.port = port


def moved_port_text(text: str, old: int, new: int) -> str:
    """``plan.txt`` after a port move: the same plan on the port actually used."""
    return text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}").replace(f"--master-port {old}", f"--master-port {new}")
