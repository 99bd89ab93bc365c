"""The pod runner: what each pod of a Kubernetes job runs in front of torchrun, as ``slurm/node.py``
does beside torchrun on each Slurm node. Standard library only, and no other module of ddpjob: the
user's image does not contain ddpjob, so ``runner`` carries this file and ``shared/heartbeat.py`` in
the pod's environment (``DDPJOB_POD_RUNNER``) and ``python3 -c`` loads them (``runner.BOOT``). The vitals,
the watch or beacon and the stop of a stalled torchrun come from the runner core every target's runner
uses (``shared/jobcore.py``), the pod's side of it said in a ``jobcore.Seat``.

In the pod it:

- starts torchrun (its argv is ours), passes its output on to the container's stdout and counts it
  (the size of a sparse file that takes no space: what ``heartbeat`` measures as output);
- on the first node (``PET_NODE_RANK`` 0) runs ``heartbeat.Watch`` at the rendezvous port (UDP), and
  serves its ``watch.json`` over HTTP on ``DDPJOB_WATCH_PORT``, which ``ddpjob status`` reads through
  the API server's pod proxy (no shared filesystem); on the others runs ``heartbeat.Beacon`` toward
  the master's address (``PET_MASTER_ADDR``, the operator's or Trainer's);
- on every pod serves, on the same port, its own ranks' stacks read by py-spy when asked
  (``podstacks``: ``ddpjob stacks`` through the pod proxy, and the first pod's watch when it names a
  stall), and samples where each rank is for the straggler rule (``stacks.FrameSampler``);
- with ``stall.action: fail``, ends torchrun when the watch says the run stalled, prints the verdict
  (``STALL_LINE``, read back by ``status``) and exits ``END_EXIT`` (124, within 1-127: the
  operator's ``ExitCode`` policy fails the job rather than recreating the pod); so does the first pod's
  runner when the run lost a pod it cannot survive (``RECOVERY_LINE``, below);
- where the runtime restarts the pod after that (a TrainJob: JobSet's OnFailure; a PyTorchJob set to
  OnFailure), keeps the verdict in ``DDPJOB_VERDICT_MARK`` (an emptyDir volume, which outlives the
  container); a runner that starts and finds it says the verdict again and exits ``END_EXIT`` without
  starting torchrun, until the backoffLimit fails the job;
- with the spec's ``recovery:`` (``DDPJOB_MAX_LOSSES``, ``DDPJOB_MIN_NODES``, ``DDPJOB_LOST_AFTER_S``; 2
  nodes or more), brings the run back after it loses a pod (``shared/restarts.py``): a node whose pod
  the operator recreated speaks from a new runner, and the run starts torchrun again on every pod (the
  new one included: it waits for that start before it starts anything); a node not heard from for
  ``lost_after`` is left out, and the run goes on without it (``PET_NNODES``/``PET_NODE_RANK`` given to
  torchrun anew). The first pod's ``watch.json`` carries the losses and what the program's metrics
  file says of them, for ``ddpjob status``; as that runner ends it prints them (``TOLD_LINE``) for a
  status that finds the pod ended and its ``watch.json`` gone;
- passes SIGTERM and SIGINT on to torchrun (the kubelet stops a pod with SIGTERM to this process).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import io
    from http.server import ThreadingHTTPServer

    from launcher.core.jsondata import JSONObject
    from launcher.targets.k8s.job import podstacks
    from launcher.targets.shared import heartbeat, jobcore, restarts, runfolder, told, vitals
else:
    # The bundle's copies in a pod (``ddpjob_<name>``, loaded before this module: ``objects/runner.py``), else the
    # package's; typed through the imports above, each loaded at its first use (``jobcore.Bundled``).
    jobcore = sys.modules.get("ddpjob_jobcore") or importlib.import_module("launcher.targets.shared.jobcore")
    heartbeat, restarts, runfolder, told, vitals = (jobcore.Bundled(name) for name in (
        "heartbeat", "restarts", "runfolder", "told", "vitals"))
    podstacks = jobcore.Bundled("podstacks", "launcher.targets.k8s.job")

END_EXIT = 124  # "timed out", as timeout(1) says it; 1-127: not retried under restartPolicy ExitCode
STALL_LINE = "[ddpjob] stall.action fail: "  # then the watch's verdict; status reads it from the pod's log
RECOVERY_LINE = "[ddpjob] recovery: "  # then why a run that lost nodes cannot go on; status reads it too
TOLD_LINE = "[ddpjob] told: "  # then, as the first pod's runner ends, its run's losses (``told.Told.final``)
STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL if torchrun hangs in a collective (``jobcore.stop``)


class PodRunner:
    """One pod's node: torchrun, its output, and the heartbeats of the run."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.node = int(env.get("PET_NODE_RANK") or env.get("RANK") or 0)
        self.nodes = int((env.get("PET_NNODES") or "1").split(":")[-1])
        self.addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR") or "127.0.0.1"
        self.port = int(env.get("PET_MASTER_PORT") or env.get("MASTER_PORT") or 29500)
        self.timeout = float(env.get("DDPJOB_STALL_TIMEOUT_S") or 300)
        self.action = env.get("DDPJOB_STALL_ACTION") or "report"
        self.watch_port = int(env.get("DDPJOB_WATCH_PORT") or 0)
        self.mark = env.get("DDPJOB_VERDICT_MARK") or None  # objects/runner.MARK_ENV
        self.proc: subprocess.Popen[bytes] | None = None
        self.stalled: str | None = None
        self.stopping = False  # SIGTERM or SIGINT came: the pod ends, nothing starts again
        self.total = 0  # bytes of output passed on, every start's
        self.beat: heartbeat.Watch | heartbeat.Beacon | None = None
        self.pump: threading.Thread | None = None
        self.recovery = self._recovery()
        self.told = told.Told(self.recovery) if self.recovery is not None and self.node == 0 else None
        self._out = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="ddpjob-pod-")
        own = runfolder.PodFolder(self.folder)
        self.counted = own.output_count  # sparse: its size is the bytes torchrun wrote
        self.state_path = own.watch
        self.steps_dir = own.vitals  # the trainer's per-rank step reports (DDPJOB_VITALS_DIR)
        # Each rank's vitals (shared/vitals.py), sent with the heartbeats; the output is fed to it as it passes.
        # With py-spy in the image, where each rank is, sampled for the straggler rule (``DDPJOB_SAMPLE_STACKS=0``: not).
        self.sampler = jobcore.sampler(self.node, lambda: self.proc.pid if self.proc else None, log=None,
                                       steps_dir=self.steps_dir, env=env)
        self.server: ThreadingHTTPServer | None = None  # serves watch.json (the first pod) and stacks.json (every pod): ``podstacks.serve``

    def say(self, text: str) -> None:
        with self._out:
            line = text if text.startswith("[ddpjob] ") else f"[ddpjob] {text}"  # STALL_LINE has it
            sys.stdout.buffer.write(f"{line}\n".encode())
            sys.stdout.buffer.flush()

    def run(self) -> int:
        if not self.argv:
            self.say("the pod runner needs torchrun's command line")
            return 2
        earlier = self._marked()
        if earlier is not None:  # restarted after it ended the run: that run stays ended
            self.say(earlier)
            self.say("this pod's runner ended the run; restarted, it does not start torchrun again")
            return END_EXIT
        open(self.counted, "wb").close()
        env = {k: v for k, v in self.env.items() if k != "DDPJOB_POD_RUNNER"}
        os.makedirs(self.steps_dir, exist_ok=True)
        env.setdefault(vitals.VITALS_DIR_ENV, self.steps_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        self.server = podstacks.serve(self.watch_port, self.state_path, self._stacks, self.say)
        rec = self.recovery
        if rec is not None and self.node != 0:  # heartbeats first: this pod may be a replaced node's
            self.beat = self._heartbeats()
            if not rec.join(rec.lost_after):
                self.say("no answer from the first pod's runner yet: starting with the run's first start")
            if rec.leave:
                if self.beat is not None:
                    self.beat.stop()
                self.say(rec.leave)
                return 0
            if rec.restart:  # a replaced node's pod: it joins the start that takes it in
                self._enter(rec, env, "this pod joins start")
        code = self._launch(env)
        if code is not None:
            return code
        if self.beat is None:
            self.beat = self._heartbeats()
        code = self._wait()
        while rec is not None and not (self.stalled or self.stopping):
            if not rec.next_start(code):
                break
            code = self._again(rec, env)
        if self.beat is not None:
            self.beat.stop()
        if self.told is not None and self.told.rec.losses:  # the pod's watch.json goes with it: said in its log
            self.say(TOLD_LINE + json.dumps(self.told.final(), separators=(",", ":")))
        if rec is not None and not (self.stalled or self.stopping):
            if rec.leave:
                self.say(f"{rec.leave} (exit 0)")
                return 0
            if rec.failed:
                self._end(f"{RECOVERY_LINE}{rec.failed}")
                return END_EXIT
        # The pod ends at once (the server's and heartbeat's threads are daemons): the controller
        # ends the job on the first pod's exit, so a pod that lingers widens the window in which
        # the other pods see the rendezvous store vanish and fail.
        if self.stalled:
            self.say(f"stalled: {self.stalled}")
            return END_EXIT
        return code if code >= 0 else 128 - code

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream = cast("io.BufferedReader", self.proc.stdout)  # stdout=PIPE, buffered: read1 returns what is there, not 64 kB
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._out:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                self.total += len(chunk)
            self.sampler.saw(chunk, time.time())  # a line cut between two chunks may go unseen: ages are samples
            try:
                os.truncate(self.counted, self.total)
            except OSError:
                pass

    def _launch(self, env: dict[str, str]) -> int | None:
        """Start torchrun (and the thread that passes its output on); its exit code when it cannot start."""
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            self.say(f"cannot start {self.argv[0]}: {exc}")
            return 127
        self.pump = threading.Thread(target=self._pump, name="ddpjob-output", daemon=True)
        self.pump.start()
        return None

    def _wait(self) -> int:
        """torchrun's exit code (its output passed on); with recovery, torchrun and its workers are
        killed when the run starts again or this node leaves it."""
        assert self.proc is not None
        while True:
            try:
                code = self.proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if self.recovery is not None and self.recovery.interrupted() and not self.stopping:
                    restarts.kill_tree(self.proc)
        if self.pump is not None:
            self.pump.join(timeout=5)
        return code

    def _again(self, rec: restarts.Recovery, env: dict[str, str]) -> int:
        """Start torchrun again for the run's members now (a node was lost or replaced) and wait for it."""
        if self.node == 0:
            loss = rec.losses[-1] if rec.losses else None
            if loss is not None:
                self.say(f"node {loss['node']} ({loss['host']}) was lost: {loss['how']}")
            if isinstance(self.beat, heartbeat.Watch):
                self.beat.issue(rec.order())  # the old torchrun (and its store) is gone: the others may start
        self._enter(rec, env, "start")
        code = self._launch(env)
        if code is not None:
            return code
        if self.node == 0:
            rec.back()
        return self._wait()

    def _enter(self, rec: restarts.Recovery, env: dict[str, str], lead: str) -> None:
        """torchrun's variables for the start ``rec`` is at (its number, the nodes and this one's rank),
        said in the log."""
        env.update({restarts.RESTART_ENV: str(rec.restart), "PET_NNODES": str(len(rec.members)),
                    "PET_NODE_RANK": str(rec.rank)})
        self.say(f"{lead} {rec.restart + 1} of the run on {len(rec.members)} node(s) "
                 f"({', '.join(str(m) for m in rec.members)}): this node's rank {rec.rank}")

    def _recovery(self) -> restarts.Recovery | None:
        """The spec's ``recovery:`` as the runner carries it (``objects/runner.py``), or None."""
        try:
            losses = int(self.env.get("DDPJOB_MAX_LOSSES") or 0)
            min_nodes = int(self.env.get("DDPJOB_MIN_NODES") or 1)
            lost_after = float(self.env.get("DDPJOB_LOST_AFTER_S") or 30)
        except ValueError:
            return None
        if losses <= 0 or self.nodes < 2:
            return None
        hosts = [""] * self.nodes
        hosts[self.node] = os.uname().nodename
        return restarts.Recovery(node=self.node, nodes=self.nodes, hosts=hosts, max_losses=losses,
                                 min_nodes=min_nodes, lost_after=lost_after, path=None,
                                 metrics=self.env.get("DDPJOB_METRICS_FILE"),
                                 gone="its pod (deleted, evicted, or its node lost) or link", joining=True)

    def _stacks(self) -> JSONObject:
        """This pod's ranks read now by py-spy (GET /stacks.json; the watch's ``where`` on the first pod)."""
        return podstacks.answer(self.node, os.uname().nodename, self.sampler.live())

    def _vitals(self) -> dict[str, object]:
        """A beacon's vitals: the sample, and the port this runner serves its stacks on (``podstacks.where``)."""
        port = self.server.server_address[1] if self.server is not None else None
        return {**self.sampler.sample(), podstacks.PORT_KEY: port}

    def _heartbeats(self) -> heartbeat.Watch | heartbeat.Beacon | None:
        """The watch (first node) or a beacon (the others), through the runner core as every target's
        runner starts them (``shared/jobcore.py``): a replaced node's pod may join (``joining``), and the
        first pod's ``watch.json`` carries what the run's losses were (``told``)."""
        rec = self.recovery
        seat = jobcore.Seat(node=self.node, nodes=self.nodes, host=os.uname().nodename, first=self.addr, port=self.port,
                            timeout=self.timeout, action=self.action, output=self.counted,
                            metrics=self.env.get("DDPJOB_METRICS_FILE") or None, watch_file=self.state_path,
                            say=self.say)
        where = podstacks.where(self.node, self._stacks, self.watch_port,
                                os.path.join(self.folder, runfolder.STACKS)) if self.node == 0 else None
        return jobcore.heartbeats(seat, on_stall=self._on_stall, sample=self.sampler.sample, where=where, recovery=rec,
                                  joining=True, told=self.told.state if self.told is not None else None,
                                  beacon_sample=self._vitals)

    def _on_stall(self, message: str) -> None:
        """stall.action is fail: say why, then stop torchrun (SIGTERM, SIGKILL ``STOP_GRACE_S`` later)."""
        if self.stalled is not None:
            return
        self.stalled = message
        self._end(STALL_LINE + message)
        jobcore.stop(self.proc, STOP_GRACE_S)

    def _end(self, line: str) -> None:
        """This runner ends the run for good: say why (``line``: ``STALL_LINE`` or ``RECOVERY_LINE`` and the
        verdict) and keep it where a restart of this container finds it (``DDPJOB_VERDICT_MARK``)."""
        self.say(line)
        if not self.mark:
            return
        try:
            with open(self.mark + ".tmp", "w", encoding="utf-8") as f:
                f.write(line)
            os.replace(self.mark + ".tmp", self.mark)
        except OSError as exc:
            self.say(f"the verdict could not be kept in {self.mark} ({exc}): a restarted pod starts torchrun again")

    def _marked(self) -> str | None:
        """The line an earlier start of this pod's runner ended the run with (``DDPJOB_VERDICT_MARK``), if any."""
        if not self.mark:
            return None
        try:
            with open(self.mark, encoding="utf-8") as f:
                return f.read().strip() or f"{RECOVERY_LINE}an earlier start of this pod's runner ended the run"
        except OSError:
            return None

    def _forward(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.beat is not None and self.node != 0:
            self.beat.stop()  # this pod ends: a replacement's heartbeats are the node's from now on
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signum)
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> int:
    """Run torchrun's ``argv`` under the pod runner; torchrun's exit code, or ``END_EXIT``. Its own
    folder (output count, watch.json, the trainer's step reports) goes with it: a pod's /tmp may be a
    volume that outlives the pod."""
    runner = PodRunner(argv, dict(os.environ))
    try:
        return runner.run()
    finally:
        shutil.rmtree(runner.folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
