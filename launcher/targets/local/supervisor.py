"""The detached process that runs a local job: ``python -m launcher.targets.local.supervisor RUN_DIR``.

It outlives the ``ddpjob submit`` call, starts one torchrun agent per node for each run (sweep
element) in turn, and keeps ``state.json`` current so any later shell can ask for status.

Why fail fast: when one node's agent fails, torchrun on the other nodes only notices at its exit
barrier (300 s by default) or never, so the supervisor stops the remaining nodes itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launcher.states import JobState
from launcher.targets.base import TaskStatus, summarize
from launcher.targets.local.target import MARKER, LocalElement, LocalNode, exit_file, read_plan
from launcher.targets.shared import procs
from launcher.targets.shared.files import write_json

_stop_requested = False
# Starts of a run whose rendezvous port another program took before torchrun bound it.
PORT_ATTEMPTS = 3


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def wait_for_exit(pids: list[int], timeout: float) -> None:
    """Return when one of ``pids`` has ended, or after ``timeout`` seconds.

    With pidfds (Linux 5.3+) the supervisor wakes the moment a node ends, not at its next poll: a
    finished job is recorded at once, and nothing spins meanwhile. Elsewhere it polls every 50 ms.
    """
    import select

    fds: list[int] = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):  # no pidfd_open here, or a pid already reaped
        for fd in fds:
            os.close(fd)
        time.sleep(min(timeout, 0.05))
        return
    try:
        select.select(fds, [], [], timeout)
    finally:
        for fd in fds:
            os.close(fd)


def _on_term(signum: int, frame: Any) -> None:
    global _stop_requested
    _stop_requested = True


class Supervisor:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = Path(run_dir)
        self.plan = read_plan(run_dir)
        self.state: dict[str, Any] = {
            "state": JobState.PENDING.value, "message": "", "port": self.plan.port,
            "supervisor_pid": os.getpid(), "started": time.time(), "ended": None,
            "elements": [
                {"index": el.index, "params": el.params, "state": JobState.PENDING.value, "message": "",
                 "output_dir": el.output_dir, "nodes": []}
                for el in self.plan.elements
            ],
        }

    def save(self) -> None:
        try:
            write_json(self.run_dir / "state.json", self.state)
        except OSError as e:
            # A full disk must not end the run: the nodes' exit records (written in place by
            # launcher.targets.local.node) still tell status how it ended.
            print(f"[ddpjob] could not write state.json: {e}", file=sys.stderr, flush=True)

    def cancelled(self) -> bool:
        return _stop_requested or (self.run_dir / "cancel-requested").exists()

    def run(self) -> int:
        self.save()
        for el, st in zip(self.plan.elements, self.state["elements"]):
            if self.cancelled():
                st["state"] = JobState.CANCELLED.value
                continue
            self.state["state"] = JobState.RUNNING.value
            for attempt in range(1, PORT_ATTEMPTS + 1):
                marks = {n.node: _size(n.log) for n in el.nodes}
                self.run_element(el, st)
                if attempt == PORT_ATTEMPTS or not self._port_was_taken(el, marks):
                    break
                self._move_port(attempt)
                st["nodes"] = []
            self.save()
            if JobState(st["state"]) is JobState.FAILED and self.plan.stop_on_failure:
                for rest in self.state["elements"][st["index"] + 1 :]:
                    rest["state"] = JobState.CANCELLED.value
                    rest["message"] = "not run: an earlier task failed (local.stop_on_failure)"
                break
        tasks = [TaskStatus(e["index"], JobState(e["state"]), e["message"]) for e in self.state["elements"]]
        final, message = summarize(tasks)
        if self.cancelled():
            final, message = JobState.CANCELLED, "cancelled by user"
        self.state["state"] = final.value
        self.state["message"] = message
        self.state["ended"] = time.time()
        self.save()
        return 0 if final == JobState.SUCCEEDED else 1

    def run_element(self, el: LocalElement, st: dict[str, Any]) -> None:
        Path(el.output_dir).mkdir(parents=True, exist_ok=True)
        running: list[tuple[LocalNode, subprocess.Popen[bytes]]] = []
        st["state"] = JobState.RUNNING.value
        st["message"] = ""
        st["started"] = time.time()
        for node in el.nodes:
            Path(node.log).parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **node.env}
            with open(node.log, "ab") as log:
                try:
                    # Through the node wrapper: it records how the agent ended even if we are killed.
                    argv = [sys.executable, "-m", "launcher.targets.local.node", exit_file(node), "--", *node.argv]
                    p = subprocess.Popen(argv, env=env, cwd=node.cwd, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
                except OSError as e:
                    st["state"] = JobState.FAILED.value
                    st["message"] = f"node {node.node}: cannot start {node.argv[0]}: {e}"
                    self._stop(running, st)
                    return
            running.append((node, p))
            st["nodes"].append({"node": node.node, "pid": p.pid, "exit_code": None, "log": node.log})
        self.save()
        failed_node: LocalNode | None = None
        while True:
            codes = [p.poll() for _, p in running]
            for rec, code in zip(st["nodes"], codes):
                rec["exit_code"] = code
            bad = [(n, c) for (n, _), c in zip(running, codes) if c not in (None, 0)]
            if bad and failed_node is None:
                failed_node = bad[0][0]
            if all(c is not None for c in codes) or failed_node is not None or self.cancelled():
                break
            # a node's end wakes us at once; a cancel (signal or file) within 0.25 s
            wait_for_exit([p.pid for (_, p), c in zip(running, codes) if c is None], 0.25)
        if self.cancelled():
            self._stop(running, st)
            st["state"] = JobState.CANCELLED.value
            st["message"] = "cancelled by user"
        elif failed_node is not None:
            self._stop(running, st)
            st["state"] = JobState.FAILED.value
            from launcher.targets.shared.rootcause import node_failure

            st["message"] = node_failure(
                node=failed_node.node, procs_per_node=self.plan.procs_per_node, log=failed_node.log,
                error_file=failed_node.error_file, torchrun_log_dir=failed_node.torchrun_log_dir)
        else:
            st["state"] = JobState.SUCCEEDED.value
        st["ended"] = time.time()

    def _port_was_taken(self, el: LocalElement, marks: dict[int, int]) -> bool:
        """The run failed because another program took the rendezvous port between the choice and
        torchrun's bind, before any worker started: worth another port (not the spec's own)."""
        if self.plan.port_fixed or self.cancelled():
            return False
        master = el.nodes[0]
        try:
            with open(master.log, "rb") as f:
                f.seek(marks.get(master.node, 0))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return False
        if "EADDRINUSE" not in text and "Address already in use" not in text:
            return False
        return not any(next(Path(n.torchrun_log_dir).glob("*/attempt_*/*"), None) for n in el.nodes)

    def _move_port(self, attempt: int) -> None:
        """A new free port, recorded in the registry, for this and every later run."""
        from launcher.registry import Registry
        from launcher.targets.local.target import LocalTarget

        old = self.plan.port
        new = Registry(self.run_dir.parents[1]).reassign_port(self.plan.job_id, LocalTarget().pick_port)
        for el in self.plan.elements:
            for n in el.nodes:
                i = n.argv.index("--master-port")
                n.argv[i + 1] = str(new)
        self.plan.port = new
        self.state["port"] = new
        note = (f"[ddpjob] rendezvous port {old} was taken by another program before torchrun could bind it; "
                f"starting the nodes again on port {new} (attempt {attempt + 1} of {PORT_ATTEMPTS})\n")
        print(note, end="", flush=True)
        for el in self.plan.elements:
            for n in el.nodes:
                try:
                    with open(n.log, "a", encoding="utf-8") as log:
                        log.write(note)
                except OSError:
                    pass
        self.save()

    def _stop(self, running: list[tuple[LocalNode, subprocess.Popen[bytes]]], st: dict[str, Any]) -> None:
        """Stop this run's agents and their workers; record how each node ended."""
        for _, p in running:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
            time.sleep(0.1)
        # Workers run in their own sessions: find stragglers by the job marker, not the process group.
        procs.kill_marked(MARKER, self.plan.job_id, grace=2.0)
        for _, p in running:
            if p.poll() is None:
                p.kill()
            p.wait()
        # A container whose engine client was killed may outlive it: remove the run's containers by name.
        names = [n.container for n, _ in running if n.container]
        from launcher.targets.local import container

        left = container.remove(self.plan.container, names) if names else []
        if left:
            print(f"[ddpjob] could not remove containers {left}", file=sys.stderr, flush=True)
        for rec, (_, p) in zip(st["nodes"], running):
            rec["exit_code"] = p.returncode


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if len(argv) != 1:
        print("usage: python -m launcher.targets.local.supervisor RUN_DIR", file=sys.stderr)
        return 2
    return Supervisor(argv[0]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
