"""The one runner core of every target's in-job runner (issue 46 item 2): the local node wrapper
(``local/job/node.py``), the Slurm node runner (``slurm/job/node.py``) and the Kubernetes pod runner
(``k8s/job/podrun.py``) start their ranks' vitals, the stall watch (``heartbeat.Watch`` on the first
node, or on the node that took a lost first node's place) or its beacon (``heartbeat.Beacon`` on the
others), the recovery's view of what the watch hears, and the stop of a stalled torchrun through here.

What differs per target is the ``Seat`` a runner gives: how its node learns its rank, the run's node
count and the first node's address (the local plan's ``DDPJOB_WATCH`` and torchrun's command line,
Slurm's variables and node list, the operator's ``PET_*``), where it writes (the watch's file, what
counts as its output), and how it says things (its log, its stdout). Each runner keeps what is its own:
how it starts torchrun and passes signals on, its exit record (local: the exit file the supervisor and
``status`` read; Slurm: ``node-<n>.json``; a pod: its log's verdict line and its mark), where the ranks'
stacks are read when the watch names a stall (local: from this machine; Slurm: through the job's shared
folder; a pod: over the pod network), and the recovery's own steps.

Standard library only at module top, as every shared in-job module: the local node wrapper imports it once
its agent has started, and the pod runner's bundle carries it (``k8s/objects/runner.py``). The shared
modules it uses are ``Bundled``: the pod's copies (``ddpjob_<name>``) where the bundle loaded them, else
the package's, loaded at their first use and typed through ``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

STOP_GRACE_S = 20.0  # a stalled torchrun: SIGTERM, then SIGKILL this much later if it hangs in a collective


class Bundled:
    """A module of ddpjob's in-job code as the pod runner's bundle names it (``ddpjob_<name>``: the pod's
    image has no ddpjob), else the package's own (``<package>.<name>``), imported at its first use. A
    runner binds one to a module's name in the ``else:`` of an ``if TYPE_CHECKING:`` that imports the real
    module, so mypy checks every use against the module itself."""

    def __init__(self, name: str, package: str = "launcher.targets.shared") -> None:
        self._name, self._package = name, package
        self._module: object | None = None

    def __getattr__(self, attr: str) -> object:  # what the module holds; typed through TYPE_CHECKING (see above)
        if self._module is None:
            self._module = sys.modules.get(f"ddpjob_{self._name}") or importlib.import_module(
                f"{self._package}.{self._name}")
        return getattr(self._module, attr)


if TYPE_CHECKING:
    from launcher.targets.shared import heartbeat, stacks, vitals
    from launcher.targets.shared.restarts import Recovery
else:
    heartbeat, stacks, vitals = Bundled("heartbeat"), Bundled("stacks"), Bundled("vitals")


class Seat:
    """What one node knows of its run, as its target's runner learned it: the one interface between a
    runner and the core.

    ``node``: its index in the run (0: the first node, whose watch hears the others); ``nodes``: the run's
    node count; ``host``: its name as the watch shows it; ``first``: the first node's address, where a
    beacon sends; ``port``: the rendezvous port, on which the watch listens (UDP); ``timeout`` and
    ``action``: the spec's ``stall:``; ``output``: the file whose growth is this node's output (its log, or
    a pod's count of the bytes passed on); ``metrics``: the run's metrics file, whose growth the watch
    counts as output too (None: not known); ``watch_file``: where the watch writes ``watch.json``;
    ``say``: a line in the node's log, said without the ``[ddpjob] `` its runner puts in front."""

    def __init__(self, *, node: int, nodes: int, host: str, first: str, port: int, timeout: float, action: str,
                 output: str, metrics: str | None, watch_file: str, say: Callable[[str], None]) -> None:
        self.node, self.nodes, self.host, self.first, self.port = node, nodes, host, first, port
        self.timeout, self.action = timeout, action
        self.output, self.metrics, self.watch_file, self.say = output, metrics, watch_file, say


def sampler(node: int, agent: Callable[[], int | None], *, log: str | None, steps_dir: str | None,
            env: dict[str, str] | None = None) -> vitals.Sampler:
    """The node's vitals (``shared/vitals.py``), sent with its heartbeats: ``agent`` gives its torchrun's
    pid, ``log`` the node's log (None: the output is fed to ``saw``), ``steps_dir`` the trainer's step
    reports; where each rank is, sampled by py-spy when it is there (``env``: the job's environment, where
    ``DDPJOB_SAMPLE_STACKS=0`` turns it off; None: this process's)."""
    return vitals.Sampler(node=node, agent=agent, log=log, steps_dir=steps_dir, frames=stacks.frame_sampler(env))


def heartbeats(seat: Seat, *, on_stall: Callable[[str], None], sample: Callable[[], dict[str, object]],
               where: Callable[[dict[str, object], list[dict[str, object]]], str | None] | None = None,
               recovery: Recovery | None = None, lead: bool = False, joining: bool = False,
               told: Callable[[], dict[str, object]] | None = None,
               beacon_sample: Callable[[], dict[str, object]] | None = None) -> heartbeat.Watch | heartbeat.Beacon | None:
    """Start this node's side of the stall watch: the ``Watch`` on the first node (or, ``lead``, on the node
    that takes a lost first node's place: it answers ``wait`` until it orders the next start), a ``Beacon``
    on the others; both call ``on_stall`` with the verdict (``stall.action: fail`` stops torchrun there).
    None when the watch cannot listen (said in the log).

    ``sample``: the node's vitals; ``beacon_sample``: a beacon's, when it says more (a pod's stacks port);
    ``where``: how the watch reads every rank's stack when it names a stall. With ``recovery`` the watch
    drops a node silent for ``lost_after`` and the beacons follow its orders (``shared/restarts.py``), and
    the recovery reads what the watch hears; ``joining``: a node may come back from a new runner (a pod the
    operator recreated): the watch takes it in, its first order is given at once, and each beacon says
    which start it follows; ``told``: what the watch's file carries besides (``shared/told.py``)."""
    rec = recovery
    lost_after = rec.lost_after if rec else None
    if seat.node != 0 and not lead:
        beacon = heartbeat.Beacon(addr=seat.first, port=seat.port, node=seat.node, host=seat.host,
                                  outputs=[seat.output], timeout=seat.timeout, action=seat.action, on_stall=on_stall,
                                  vitals=beacon_sample or sample, lost_after=lost_after,
                                  on_cut=rec.cut if rec else None, on_order=rec.ordered if rec else None,
                                  extra=rec.beat if rec and joining else None)
        beacon.start()
        return beacon
    outputs = [seat.output, *([seat.metrics] if seat.metrics else [])]
    watch = heartbeat.Watch(port=seat.port, nodes=seat.nodes, host=seat.host, outputs=outputs,
                            state_path=seat.watch_file, timeout=seat.timeout, action=seat.action, on_stall=on_stall,
                            vitals=sample, lost_after=lost_after, on_lost=rec.lost if rec else None,
                            on_replaced=rec.replaced if rec and joining else None,
                            on_followed=rec.first_replaced if rec and joining else None, extra=told,
                            own=seat.node, gone=(rec.first,) if lead and rec else (), hold=lead, where=where)
    if rec is not None:
        members = rec

        def silent() -> float:  # seconds since the stalest member was heard
            return max((time.time() - _heard(r) for r in watch.nodes.values() if r["node"] in members.members),
                       default=0.0)

        def heard() -> set[int]:  # the members heard lately
            return {n for r in watch.nodes.values()
                    if isinstance(n := r["node"], int) and (h := _heard(r)) and time.time() - h < members.lost_after / 2}

        rec.silent, rec.heard = silent, heard
        if joining:
            watch.issue(rec.order())
    why = watch.start()
    if why:
        seat.say(why)
        return None
    return watch


def stop(proc: subprocess.Popen[bytes] | None, grace: float = STOP_GRACE_S) -> None:
    """Stop a stalled torchrun and wait for it: SIGTERM (it stops its workers), SIGKILL ``grace`` seconds
    later if it hangs in a collective; nothing when it has ended already."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
    except ProcessLookupError:
        pass


def exit_status(code: int) -> int:
    """A process's exit code as a shell says it: a signal's death (-N) as 128 + N."""
    return 128 - code if code < 0 else code


def _heard(rec: dict[str, object]) -> float:
    """When the watch last heard the node of its record ``rec`` (0: never)."""
    heard = rec["heard"]
    return float(heard) if isinstance(heard, (int, float)) else 0.0
