"""The detached process that runs a local job (started by ``LocalTarget.submit``; by hand:
``python -m launcher.targets.local.job.supervisor RUN_DIR``).

It outlives the ``ddpjob submit`` call, starts one torchrun agent per node for each run (sweep
element) in turn, and keeps ``state.json`` current so any later shell can ask for status.

Why fail fast: when one node's agent fails, torchrun on the other nodes only notices at its exit
barrier (300 s by default) or never, so the supervisor stops the remaining nodes itself.

Why the quick start: the supervisor stands between ``ddpjob submit`` and the first torchrun. It
starts the first run's nodes from the raw plan.json with the few standard modules it has loaded at
that moment (no subprocess: the node wrappers start through posix_spawn), and it never imports the
typed plan (dataclasses, the payload and its imports) or pathlib on a job's ordinary way: ~20 ms from
its start to its nodes' end (tests/bench/cli_bench.py ``tricks``, ``quick_plan_reader``), CPU that
would be taken from the agents importing torch beside it. Failures and port retries import what they
need. (``typing`` it does import: ~5 ms, within the noise of that measure.)
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING

from launcher.targets.local.job import node as node_wrapper
from launcher.targets.local.job.secretenv import SECRET_ENV
from launcher.targets.local.job.starts import Starts
from launcher.targets.local.job.staterecord import StateElement, StateNode, StateRecord
from launcher.targets.shared.runfolder import RunFolder, exit_file, node_tag

if TYPE_CHECKING:
    from launcher.targets.local.payload import LocalElement, LocalNode, LocalPayload

# Runs this module as ``python -m`` would, from the directory that holds this installation's
# ``launcher`` package (site-packages, or a checkout), without ``site``: see command().
_SUPERVISOR_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
                    "from launcher.targets.local.job.supervisor import main; sys.exit(main(sys.argv[1:], from_submit=True))")


def command(run_dir: str) -> list[str]:
    """The supervisor's command line.

    It is on the path from ``ddpjob submit`` to the first torchrun, so it starts in isolated mode
    without ``site`` (``-I -S``): no .pth files, editable-install finders or user site to process,
    nothing from the environment's PYTHON* variables, which are for the job's own processes (they
    get the environment unchanged). It needs only the standard library and this package, found at
    the directory the package was loaded from.
    """
    return [sys.executable, "-I", "-S", "-c", _SUPERVISOR_BOOT, node_wrapper.package_root(), run_dir]


_stop_requested = False
# Starts of a run whose rendezvous port another program took before torchrun bound it.
PORT_ATTEMPTS = 3
FAIL_GRACE_S = 1.5  # after a node fails, how long the others may take to end on their own before the stop

def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _on_term(signum: int, frame: object) -> None:
    global _stop_requested
    _stop_requested = True


def read_plan(run_dir: str, from_submit: bool = False) -> LocalPayload:
    """The plan from plan.json. ``from_submit``: the file was just written by this ddpjob's submit
    (every field of the typed plan, ``to_json``), so it is read as it stands, as plain namespaces
    with the typed plan's attributes, without importing the typed plan (~20 ms off the supervisor's
    way to its nodes, tests/bench/cli_bench.py ``tricks``). Any other plan (a supervisor started by
    hand, an older run dir) goes through the typed reader, which fills in defaults and says what is
    wrong."""
    if not from_submit:
        return _typed_plan(run_dir)
    import json

    try:
        with open(RunFolder(run_dir).plan, "rb") as f:
            data = json.load(f)
        data["elements"] = [SimpleNamespace(**{**el, "nodes": [SimpleNamespace(**n) for n in el["nodes"]]})
                            for el in data["elements"]]
        return SimpleNamespace(**data)  # type: ignore[return-value]
    except (OSError, ValueError, LookupError, TypeError):
        return _typed_plan(run_dir)


def _typed_plan(run_dir: str) -> LocalPayload:
    from launcher.targets.local.payload import read_plan as read_typed_plan

    return read_typed_plan(run_dir)


class Started(SimpleNamespace):
    """Nodes started by ``Starts.nodes``: ``running``, ``error`` (None or why one could not start),
    ``started`` (time) and ``marks`` (each log's size before, by node)."""


def start_first_run(run_dir: str, plan: LocalPayload, starts: Starts) -> Started | None:
    """The first run's nodes, started before anything else is imported; None when a cancel came
    first (the run loop records it)."""
    if not plan.elements or _stop_requested or os.path.exists(RunFolder(run_dir).cancel_requested):
        return None
    first = plan.elements[0]
    marks = {n.node: _size(n.log) for n in first.nodes}
    started = time.time()
    running, error = starts.nodes(first.nodes, first.output_dir, first.index)
    return Started(running=running, error=error, started=started, marks=marks)


class Supervisor:
    def __init__(self, run_dir: str, plan: LocalPayload, starts: Starts) -> None:
        from launcher.core.states import JobState

        self.starts = starts
        self.run_dir = os.path.abspath(run_dir)
        self.plan = plan
        self.state = StateRecord(
            JobState.PENDING.value, port=self.plan.port, supervisor_pid=os.getpid(), started=time.time(),
            cgroup=starts.cgroup, cgroup_unavailable=starts.cgroup_unavailable or None,
            elements=[StateElement(el.index, el.params, JobState.PENDING.value, "", el.output_dir)
                      for el in self.plan.elements])

    def save(self) -> None:
        # A full disk must not end the run: the state stays in memory and is written again when it
        # can be (launcher.targets.local.job.statefile); the nodes' exit records, written in place by
        # launcher.targets.local.job.node, tell status how the runs ended meanwhile.
        self.files.save(self.state)

    def cancelled(self) -> bool:
        return _stop_requested or os.path.exists(RunFolder(self.run_dir).cancel_requested)

    def run(self, early: Started | None = None) -> int:
        """Run every element in turn; ``early``: the first one's nodes, already started
        (start_first_run)."""
        from launcher.core.states import JobState, summarize
        from launcher.targets.local.job.statefile import StateFile

        self.files = StateFile(self.run_dir)  # after the first run's nodes started: nothing delays them
        if early is None:
            self.save()
        for el, st in zip(self.plan.elements, self.state.elements):
            started = early if el.index == 0 else None
            if started is None and self.cancelled():  # started nodes are stopped by run_element
                st.state = JobState.CANCELLED.value
                continue
            self.state.state = JobState.RUNNING.value
            for attempt in range(1, PORT_ATTEMPTS + 1):
                marks = started.marks if started is not None else {n.node: _size(n.log) for n in el.nodes}
                self.run_element(el, st, started)
                started = None  # a new attempt starts its nodes again
                if attempt == PORT_ATTEMPTS or not self._port_was_taken(el, st, marks) or not self._move_port(attempt):
                    break
                st.nodes = []
            self.save()
            if JobState(st.state) is JobState.FAILED and self.plan.stop_on_failure:
                for rest in self.state.elements[st.index + 1 :]:
                    rest.state = JobState.CANCELLED.value
                    rest.message = "not run: an earlier task failed (local.stop_on_failure)"
                break
        tasks = [SimpleNamespace(index=e.index, state=JobState(e.state), message=e.message) for e in self.state.elements]
        final, message = summarize(tasks)
        if self.cancelled():
            final, message = JobState.CANCELLED, "cancelled by user"
        if self.plan.network_name:  # before the final state: a finished job has left nothing behind
            from launcher.targets.local.network import remove_job_network

            remove_job_network(self.plan.container, self.plan.network_name, [
                n.container for el in self.plan.elements for n in el.nodes if n.container], self.plan.job_id)
        if self.starts.cgroup:  # nothing outlives its job: what its processes left running (daemons) is stopped
            from launcher.targets.local.job import cgroups

            left = cgroups.left_behind(self.starts.cgroup)
            if left:
                self.state.left_behind = left
                message = f"{message}; {left}" if message else left
        self.state.state = final.value
        self.state.message = message
        self.state.ended = time.time()
        self.save()
        # Until the final state is written (a full disk refused it; not what waiting cannot cure), or a
        # cancel: status would read a stale state.json, or exit records that disk may have refused too.
        while self.files.failed is not None and self.files.passing and not self.cancelled():
            time.sleep(1.0)
            self.files.save(self.state)
        return 0 if final == JobState.SUCCEEDED else 1

    def run_element(self, el: LocalElement, st: StateElement, started: Started | None = None) -> None:
        """Run one element's nodes to their end; ``started``: its nodes, already started from the raw
        plan (start_first_run), paired here with the typed ones."""
        from launcher.core.states import JobState

        if started is not None:
            st.started, error = started.started, started.error
            running = [(node, p) for node, (_, p) in zip(el.nodes, started.running)]
        else:
            st.started = time.time()
            running, error = self.starts.nodes(el.nodes, el.output_dir, el.index)
        st.state = JobState.RUNNING.value
        st.message = ""
        st.nodes = [StateNode(n.node, p.pid, n.log) for n, p in running]
        if error is not None:
            st.state = JobState.FAILED.value
            st.message = error
            self._stop(running, st)
            return
        self.save()
        while True:
            failed_node, failed, noticed = self._wait(running, st)
            if failed_node is not None and not self.cancelled():
                # The others a moment to end on their own (a peer's failure ends them too): named after it.
                node_wrapper.wait_for_all([p for _, p in running], FAIL_GRACE_S)
                again = self._bring_back(el, st, running, noticed)
                if again is not None:
                    running = again
                    continue
            if self.cancelled():  # (also while a lost node's run was being brought back)
                self._stop(running, st)
                st.state = JobState.CANCELLED.value
                st.message = "cancelled by user"
            elif failed_node is None:
                st.state = JobState.SUCCEEDED.value
                st.message = ""
            else:
                self._failed(el, st, running, failed_node, failed)
            break
        st.ended = time.time()

    def _wait(self, running: list[tuple[LocalNode, node_wrapper.Proc]],
              st: StateElement) -> tuple[LocalNode | None, tuple[int, int], float]:
        """Until every node has ended, one has failed, or a cancel: the first failed node (None when
        none failed), its wrapper's pid and exit code before any stop, and when it was noticed."""
        while True:
            codes = [p.poll() for _, p in running]
            for rec, code in zip(st.nodes, codes):
                rec.exit_code = code
            bad = [(n, p, c) for (n, p), c in zip(running, codes) if c not in (None, 0)]
            if bad:
                return bad[0][0], (bad[0][1].pid, bad[0][2] or 0), time.time()
            if all(c is not None for c in codes) or self.cancelled():
                return None, (0, 0), 0.0
            self.files.retry(self.state)  # a state a full disk refused is written once it can be
            # a node's end wakes us at once; a cancel (signal or file) within 0.25 s
            node_wrapper.wait_for_exit([p.pid for (_, p), c in zip(running, codes) if c is None], 0.25)

    def _bring_back(self, el: LocalElement, st: StateElement, running: list[tuple[LocalNode, node_wrapper.Proc]],
                    noticed: float) -> list[tuple[LocalNode, node_wrapper.Proc]] | None:
        """When a node was lost (killed from outside) and the run may lose another (recovery.max_losses):
        stop the rest, record the loss, start every node again; the new processes (None: not brought
        back, the run fails as it would have)."""
        from launcher.targets.local.job import recover

        ended = [(n.node, p.pid, p.poll(), exit_file(n.log)) for n, p in running if p.poll()]
        lost = recover.lost_nodes(ended)
        losses = st.losses = st.losses if st.losses is not None else []
        budget = int(getattr(self.plan, "max_losses", 0) or 0)  # a plan.json from before recovery: none
        if not lost or self.cancelled() or len(losses) + len(lost) > budget:
            if lost and budget:
                st.recovery_note = (f"not brought back: the run had lost {len(losses)} node(s) before, "
                                       f"and recovery.max_losses is {budget}")
            return None
        task = RunFolder(self.run_dir).task(el.index)
        new = recover.record(lost, noticed=noticed, reached=recover.reached_step(task.vitals))
        restart = st.restarts + 1
        what = recover.losses_text(lost)
        st.message = f"{what}; starting the run's {len(el.nodes)} node(s) again (loss {len(losses) + len(new)} of at most {budget})"
        losses.extend(new)
        self._stop(running, st)
        self.save()
        if self.cancelled():
            return None
        recover.note_in_logs([n.log for n in el.nodes], f"{what}: ddpjob stopped the run's other nodes and starts "
                             f"all {len(el.nodes)} again (restart {restart}; recovery.max_losses {budget})")
        again, error = self.starts.nodes(el.nodes, el.output_dir, el.index, restart=restart)
        recover.back(new, nodes=len(again), restart=restart)
        st.restarts = restart
        st.nodes = [StateNode(n.node, p.pid, n.log) for n, p in again]
        if error is not None:
            st.recovery_note = f"not brought back: {error}"
            self._stop(again, st)
            return None
        st.message = ""
        self.save()
        return again

    def _failed(self, el: LocalElement, st: StateElement, running: list[tuple[LocalNode, node_wrapper.Proc]],
                failed_node: LocalNode, failed: tuple[int, int]) -> None:
        """The run failed (not brought back): stop what is left and say why, first cause first."""
        from launcher.core.states import JobState
        from launcher.targets.shared.rootcause import NodeFailure, first_and_after, killed_node, own_errors

        ended = [NodeFailure(n.node, n.log, n.error_file, n.torchrun_log_dir) for n, p in running if p.poll()]
        self._stop(running, st)
        st.state = JobState.FAILED.value
        record = node_wrapper.read_record(exit_file(failed_node.log))
        killed = killed_node(node=failed_node.node, nodes=len(el.nodes), wrapper_pid=failed[0],
                             wrapper_code=failed[1], record=record)
        first, st.message = (failed_node.node, killed) if killed else first_and_after(ended, self.plan.procs_per_node)
        st.message = own_errors(st.nodes, [n.log for n in el.nodes], first, st.message)
        if note := st.recovery_note:
            st.recovery_note = None
            st.message += f" ({note})"

    def _port_was_taken(self, el: LocalElement, st: StateElement, marks: dict[int, int]) -> bool:
        if st.state != "FAILED" or self.cancelled():  # a run that succeeded had its port
            return False
        from launcher.targets.local.portmove import port_was_taken

        return port_was_taken(self.plan, el, marks)

    def _move_port(self, attempt: int) -> bool:
        from launcher.targets.local.portmove import move_port

        new = move_port(self.plan, self.run_dir, attempt, PORT_ATTEMPTS)
        if new is None:
            return False
        self.state.port = new
        self.save()
        return True

    def _stop(self, running: list[tuple[LocalNode, node_wrapper.Proc]], st: StateElement) -> None:
        """Stop this run's agents and their workers; record how each node ended."""
        for _, p in running:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
            time.sleep(0.1)
        # Workers run in their own sessions: find stragglers by the job marker, not the process group.
        from launcher.targets.local.payload import MARKER
        from launcher.targets.shared import procs

        procs.kill_marked(MARKER, self.plan.job_id, grace=2.0)
        for _, p in running:
            if p.poll() is None:
                p.kill()
            p.wait()
        if self.starts.cgroup:  # what the marker cannot find: a process with its own session and environment
            from launcher.targets.local.job import cgroups

            for n, _ in running:
                cgroups.stop(os.path.join(self.starts.cgroup, node_tag(st.index, n.node)))
        # A container whose engine client was killed may outlive it: remove the run's containers by name.
        names = [n.container for n, _ in running if n.container]
        from launcher.targets.local import container
        from launcher.targets.local.job.statefile import say

        left = container.remove(self.plan.container, names) if names else []
        if left:
            say(f"[ddpjob] could not remove containers {left}")
        for rec, (_, p) in zip(st.nodes, running):
            rec.exit_code = p.returncode


def main(argv: list[str], from_submit: bool = False) -> int:
    """Run the job of the run dir ``argv[0]``; ``from_submit``: started by submit (see read_plan)."""
    node_wrapper.unbuffered_output()  # its output goes to supervisor.log: a full disk must not make it exit 120
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if len(argv) != 1:
        print("usage: python -m launcher.targets.local.job.supervisor RUN_DIR", file=sys.stderr)
        return 2
    secrets: dict[str, dict[str, str]] = {}
    if SECRET_ENV in os.environ:  # removed before anything starts: no node inherits the whole set
        import json

        try:
            secrets = json.loads(os.environ.pop(SECRET_ENV))
        except ValueError:  # not what submit wrote: the nodes start with *** for those values
            print(f"[ddpjob] {SECRET_ENV} in the environment is not ddpjob's: ignored", file=sys.stderr)
    plan = read_plan(argv[0], from_submit)  # a plan that cannot be read stops here, with why, before any node starts
    from launcher.targets.local.job import cgroups

    starts = Starts(*cgroups.make_job(plan.job_id), secrets=secrets)
    return Supervisor(argv[0], plan, starts).run(start_first_run(argv[0], plan, starts))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
