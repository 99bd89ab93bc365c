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
from launcher.targets.shared.rootcause import node_failure

_stop_requested = False


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
            self.run_element(el, st)
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
            time.sleep(0.1)
        if self.cancelled():
            self._stop(running, st)
            st["state"] = JobState.CANCELLED.value
            st["message"] = "cancelled by user"
        elif failed_node is not None:
            self._stop(running, st)
            st["state"] = JobState.FAILED.value
            st["message"] = node_failure(
                node=failed_node.node, procs_per_node=self.plan.procs_per_node, log=failed_node.log,
                error_file=failed_node.error_file, torchrun_log_dir=failed_node.torchrun_log_dir)
        else:
            st["state"] = JobState.SUCCEEDED.value
        st["ended"] = time.time()

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
