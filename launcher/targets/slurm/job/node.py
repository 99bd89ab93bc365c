"""The per-node entry of a Slurm job: submitit unpickles a ``NodeRunner`` in each Slurm task (one
per node) and calls it. It resolves the rendezvous from the allocation and runs torchrun.

Run time, not submit time, decides the rendezvous: the first host of ``$SLURM_JOB_NODELIST`` and
``slurm_port(job id, array index)``, so a requeued job that lands on other nodes, and two jobs sharing
nodes, still meet in the right place.

Preemption and time limits: Slurm sends USR2 (``--signal=USR2@N``, or ``scancel --signal=USR2``)
to every process of the step. torchrun is started with USR2 ignored (it would die of it, leaving
its workers alone); the training processes install their own handler and checkpoint. The runner
also sends SIGTERM to its torchrun, which stops the workers cleanly, and then submitit's handler
calls ``checkpoint()`` on node 0, which waits for torchrun and hands submitit a fresh runner to
requeue (``scontrol requeue``). The requeued run resumes from the trainer's checkpoint.

Nothing outlives the run: the runner is the child subreaper of what it starts, and stops whatever is left
under it when the run ends, on SIGTERM at once (``reaper.py``).

It runs inside the job (maybe in a container), importing the standard library, this wing (its plain data in
``nodeplan.py``) and the shared in-job modules, nothing client-side (submitit inside ``checkpoint`` only); the
vitals, the stall watch and the stop of a stalled torchrun come from the runner core
(``shared/jobcore.py``); its runner answers ``ddpjob stacks`` (``shared/stackshare.Answerer``).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from types import FrameType

from launcher.targets.shared import heartbeat, jobcore, netif, stackshare
from launcher.targets.shared.files import write_json
from launcher.targets.shared.restarts import RESTART_ENV, Recovery, kill_tree
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm.job.nodelist import expand_nodelist, slurm_port
from launcher.targets.slurm.job.nodeplan import SlurmCommon, SlurmElement, node_argv, node_env, node_paths
from launcher.targets.slurm.job.reaper import Reaper
from launcher.targets.slurm.job.recover import elect, end_allocation, finish, shrink

# How long a node whose first node's name resolves to loopback waits for the first node's record.
FIRST_NODE_WAIT_S = 30.0


class NodeFailed(RuntimeError):
    """torchrun on this node exited with an error; the message names the node and its exit code."""


class NodeRunner:
    """Callable pickled by submitit: one run (sweep element) of a job, on whichever node runs it."""

    def __init__(self, common: SlurmCommon, element: SlurmElement) -> None:
        self.common = common
        self.element = element
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop_sent = False
        self._stalled: str | None = None  # why the stall watch ended this node (stall.action: fail)
        self._answerer: stackshare.Answerer | None = None
        self._reaper = Reaper(lambda: [self._proc.pid] if self._proc else [])  # torchrun stops its own tree

    def __getstate__(self) -> dict[str, object]:
        return {"common": self.common, "element": self.element}

    def __setstate__(self, state: dict[str, object]) -> None:
        common, element = state["common"], state["element"]
        assert isinstance(common, SlurmCommon) and isinstance(element, SlurmElement)  # ``__getstate__``'s
        self.__init__(common, element)  # type: ignore[misc]

    def rendezvous(self, env: dict[str, str]) -> tuple[str, int]:
        """(first host of the allocation, port): the spec's master_port, else the free port the sbatch
        script found on the first node (``DDPJOB_MASTER_PORT``), else one derived from the job id."""
        hosts = expand_nodelist(env.get("SLURM_JOB_NODELIST", "")) or [socket.gethostname()]
        found = env.get("DDPJOB_MASTER_PORT", "")
        port = self.common.master_port or (int(found) if found.isdigit() else slurm_port(
            env.get("SLURM_ARRAY_JOB_ID") or env["SLURM_JOB_ID"], env.get("SLURM_ARRAY_TASK_ID")
        ))
        return hosts[0], port

    def __call__(self) -> dict[str, object]:
        """Run this node; however the run ends, stop what it left running (``reaper``: the runner is their
        subreaper) and say so in the node's log."""
        self._reaper.start()
        try:
            return self._run()
        finally:
            self._reaper.end()

    def _run(self) -> dict[str, object]:
        node = os.environ.get("SLURM_NODEID", "0")
        first, port = self.rendezvous(dict(os.environ))
        paths = node_paths(self.common.job_dir, self.element.index, node)
        os.makedirs(os.path.dirname(paths["log"]), exist_ok=True)
        self._reaper.log = paths["log"]
        os.makedirs(self.element.output_dir, exist_ok=True)
        env = {**os.environ, **node_env(self.common, self.element, node=node)}
        try:
            os.unlink(paths["error_file"])  # a requeued run must not report the last run's failure
        except FileNotFoundError:
            pass
        host = socket.gethostname()
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        # The node's record (``node_paths``' ``record``), which ``slurm/status.py`` reads.
        record: dict[str, object] = {
            "node": int(node), "host": host, "rendezvous": f"{first}:{port}", "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "restart": restart, "state": "running", "started": time.time(), "machine": machine_id(), "start": 0}
        write_json(paths["record"], record)  # early: the other nodes compare their machine with the first's
        addr, problem = self._network(node, host, first, port, env, record)
        record["rendezvous"] = f"{addr}:{port}"
        argv = node_argv(self.common, self.element, node=node, addr=addr, port=str(port))
        write_json(paths["record"], record)
        if problem:
            with open(paths["log"], "ab", buffering=0) as log:
                log.write(f"[ddpjob] {problem}\n".encode())
            record.update(state="exited", exit_code=2, ended=time.time(), preempted=False, error=problem)
            write_json(paths["record"], record)
            raise NodeFailed(problem)
        self._install_forwarder()
        recovery = self._recovery(int(node), paths)
        with open(paths["log"], "ab", buffering=0) as log:
            via = f" ({record['address']}, {record['interface']})" if record.get("interface") else ""
            log.write(f"[ddpjob] node {node} on {host}{via}: rendezvous {first} = {addr}:{port}, "
                      f"start {restart + 1}\n".encode())
            self._proc = self._start(argv, env, log)
            watch = self._watch(int(node), host, addr, port, paths, log, recovery)
            code = self._wait(recovery)
            while recovery is not None and not (self._stalled or self._stop_sent):
                if code != 0 and not recovery.interrupted():  # said now: the run's root cause while it waits
                    record.update(state="exited", exit_code=code, ended=time.time())
                    write_json(paths["record"], record)
                if recovery.electing is not None:  # the first node is lost: take its place, or follow
                    own = str(record.get("address") or addr)
                    watch, addr = elect(recovery, watch, functools.partial(
                        self._watch, int(node), host, own, port, paths, log, recovery, lead=True),
                        functools.partial(self._address_of, recovery=recovery), own, log)
                if not recovery.next_start(code):
                    break
                code = self._again(recovery, env, log, watch, record, paths["record"], addr, str(port))
            if watch is not None:
                watch.stop()
        record.update(state="exited", exit_code=code, ended=time.time(), preempted=self._stop_sent)
        if recovery is not None and not (self._stalled or self._stop_sent) and (
                recovery.leave or recovery.losses or recovery.failed):
            result, failure = finish(recovery, record, paths, code, RunFolder(self.common.job_dir).task(self.element.index))
            if failure:
                raise NodeFailed(failure)
            return result
        if self._stalled:
            record.update(error=self._stalled)
            write_json(paths["record"], record)
            end_allocation(paths["log"])
            raise NodeFailed(self._stalled)
        write_json(paths["record"], record)
        if self._stop_sent:
            # Preempted: node 0's submitit handler requeues the job, which kills this task. Do not
            # report a result before that (a finished task would look like a finished run).
            time.sleep(max(5, self.common.signal_delay_s - 5))
            raise NodeFailed(f"node {node} was preempted and the job was not requeued")
        if code != 0:
            raise NodeFailed(f"torchrun on node {node} ({record['host']}) exited with code {code}; see {paths['log']}")
        return {"node": int(node), "host": record["host"], "exit_code": code}

    def _start(self, argv: list[str], env: dict[str, str], log: BinaryIO) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=self.common.workdir, preexec_fn=_ignore_usr2,  # noqa: PLW1509 - before exec, no lock taken
        )

    def _wait(self, recovery: Recovery | None) -> int:
        """torchrun's exit code; with recovery, torchrun is killed (with its workers) when the run starts
        again, or this node leaves it."""
        assert self._proc is not None
        if recovery is None:
            return self._proc.wait()
        while True:
            try:
                return self._proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if recovery.interrupted():
                    kill_tree(self._proc)
                    return self._proc.wait()

    def _recovery(self, node: int, paths: dict[str, str]) -> Recovery | None:
        c = self.common
        if not c.max_losses or c.nodes < 2:
            return None
        hosts = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST", ""))
        return Recovery(node=node, nodes=c.nodes, hosts=hosts, max_losses=c.max_losses, min_nodes=c.min_nodes,
                        lost_after=float(c.lost_after_s), path=RunFolder(c.job_dir).task(self.element.index).recovery,
                        metrics=os.path.join(self.element.output_dir, "metrics.jsonl"), successor=True)

    def _address_of(self, node: int, recovery: Recovery) -> str | None:
        """Another node's address, as its runner recorded it (its side of the route to the first node),
        else its host name resolved here."""
        own = _read_json(node_paths(self.common.job_dir, self.element.index, node)["record"]).get("address")
        if isinstance(own, str) and own:
            return own
        try:
            return socket.gethostbyname(recovery.host(node))
        except OSError:
            return None

    def _again(self, recovery: Recovery, env: dict[str, str], log: BinaryIO,
               watch: heartbeat.Watch | heartbeat.Beacon | None, record: dict[str, object], record_path: str,
               addr: str, port: str) -> int:
        """Start torchrun again for the run's members now (a node was lost) and wait for it."""
        note = shrink(recovery) if recovery.leads else ""
        argv = node_argv(self.common, self.element, node=str(recovery.node), addr=addr, port=port,
                         nodes=len(recovery.members), node_rank=str(recovery.rank))
        env[RESTART_ENV] = str(recovery.restart)
        if note and recovery.losses:
            loss = recovery.losses[-1]
            log.write(f"[ddpjob] node {loss['node']} ({loss['host']}) was lost: {loss['how']}\n".encode())
        log.write(f"[ddpjob] start {recovery.restart + 1} of the run on {len(recovery.members)} node(s) "
                  f"({', '.join(f'{m} ({recovery.host(m)})' for m in recovery.members)}): this node's rank "
                  f"{recovery.rank}{'; ' + note if note else ''}\n".encode())
        record.update(state="running", rank=recovery.rank, start=recovery.restart, members=recovery.members)
        record.pop("exit_code", None)
        record.pop("ended", None)
        write_json(record_path, record)
        self._proc = self._start(argv, env, log)
        if isinstance(watch, heartbeat.Watch):
            recovery.back(note)
            watch.issue(recovery.order())
        return self._wait(recovery)

    def _network(self, node: str, host: str, first: str, port: int, env: dict[str, str],
                 record: dict[str, object]) -> tuple[str, str | None]:
        """The rendezvous address and this node's side of it, checked before torchrun starts.

        Returns (MASTER_ADDR: the first node's address as this node resolves it, or its name when it
        does not resolve here; a reason to stop now or None). Records the node's own address and
        interface toward the rendezvous. The interface variables are checked against this node's
        interfaces (``netif.check``); with several nodes and no Gloo interface given, Gloo is told
        the interface that leads to the first node, so it never binds a loopback address that the
        other nodes cannot reach.
        """
        where = f"node {node} ({host})"
        updates, problem = netif.check(env, where)
        env.update(updates)
        ifnames = record["env_ifname"] = {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if env.get(k)}
        if problem:
            return first, problem
        try:
            master, own, iface = netif.route_to(first, port)
        except OSError as exc:
            return first, f"{where}: the first node's name {first!r} does not lead anywhere from here ({exc})"
        record.update(master_addr=master, address=own, interface=iface)
        if self.common.nodes > 1 and netif.is_loopback(master) and node != "0" and not self._first_node_here(record):
            return master, (f"{where}: the first node's name {first!r} resolves to {master}, a loopback address, "
                            "on this node, and the first node does not run on this machine: fix the nodes' "
                            "/etc/hosts or DNS")
        if self.common.nodes > 1 and iface and not netif.is_loopback(own) and not env.get("GLOO_SOCKET_IFNAME"):
            env["GLOO_SOCKET_IFNAME"] = iface
            ifnames["GLOO_SOCKET_IFNAME"] = iface
        return master, None

    def _first_node_here(self, record: dict[str, object]) -> bool:
        """Whether the first node of this run shares this machine and network namespace (several
        slurmd on one host: Slurm's multiple-slurmd setup), so a loopback address of the first node is
        reachable from here. Reads the first node's record (written as it starts, on the job's shared
        directory), waiting up to ``FIRST_NODE_WAIT_S`` seconds for the one of this very start."""
        path = node_paths(self.common.job_dir, self.element.index, 0)["record"]
        deadline = time.monotonic() + FIRST_NODE_WAIT_S
        while True:
            first = _read_json(path)
            if (first.get("slurm_job_id") == record["slurm_job_id"] and first.get("restart") == record["restart"]
                    and first.get("machine")):
                return bool(first["machine"] == record["machine"])
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _watch(self, node: int, host: str, addr: str, port: int, paths: dict[str, str],
               log: BinaryIO, recovery: Recovery | None = None, lead: bool = False) -> heartbeat.Watch | heartbeat.Beacon | None:
        """Start the heartbeats of this run (``launcher.targets.shared.heartbeat``): the watch on the first
        node (or, ``lead``, on the one that takes a lost first node's place: it answers ``wait`` until it
        orders the next start), a beacon on the others; both end torchrun on a stall with action fail."""
        c = self.common
        task = RunFolder(c.job_dir).task(self.element.index)
        sampler = jobcore.sampler(node, lambda: self._proc.pid if self._proc else None, log=paths["log"],
                                  steps_dir=task.vitals, env={**os.environ, **self.element.env})
        self._answerer = stackshare.answering(self._answerer, task.stacks_request, task.node_stacks(node), node, host,
                                          sampler.live)  # ddpjob stacks, through the shared job folder
        seat = jobcore.Seat(node=node, nodes=c.nodes, host=host, first=addr, port=port, timeout=float(c.stall_timeout_s),
                            action=c.stall_action, output=paths["log"],
                            metrics=os.path.join(self.element.output_dir, "metrics.jsonl"), watch_file=paths["watch"],
                            say=functools.partial(_say, log))
        return jobcore.heartbeats(seat, on_stall=self._on_stall, sample=sampler.sample, recovery=recovery, lead=lead,
                                  where=stackshare.asking(task, c.nodes))

    def _on_stall(self, message: str) -> None:
        """stall.action is fail: stop torchrun (SIGTERM, SIGKILL 20 s later if it hangs in a collective)."""
        self._stalled = message
        jobcore.stop(self._proc)

    def checkpoint(self, *args: object, **kwargs: object) -> object:
        """submitit's preemption hook (node 0): stop torchrun, then requeue a fresh runner."""
        self._stop_child()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=max(5, self.common.signal_delay_s - 10))
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if not self.common.requeue:
            return None
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(NodeRunner(self.common, self.element))

    def _stop_child(self) -> None:
        self._stop_sent = True
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
            except ProcessLookupError:
                pass

    def _install_forwarder(self) -> None:
        """Run our stop on every node, then submitit's handler (which checkpoints on node 0)."""
        previous = signal.getsignal(signal.SIGUSR2)

        def on_usr2(signum: int, frame: FrameType | None) -> None:
            self._stop_child()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGUSR2, on_usr2)


def machine_id() -> str:
    """This kernel's boot id and this process's network namespace: equal on two nodes exactly when
    they share one machine's network, loopback addresses included ("" where Linux does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return ""


def _read_json(path: str) -> dict[str, object]:
    """The JSON object in ``path`` (another node's record), or an empty one."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _say(log: BinaryIO, text: str) -> None:
    log.write(f"[ddpjob] {text}\n".encode())


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


if __name__ == "__main__":  # pragma: no cover - a hint for people who run the module by hand
    sys.exit("launcher.targets.slurm.job.node is started by submitit inside a Slurm job, not by hand")
