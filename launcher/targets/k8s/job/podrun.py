"""The pod runner: what each pod of a Kubernetes job runs in front of torchrun, as ``slurm/node.py``
does beside torchrun on each Slurm node. Standard library only, and no other module of ddpjob: the
user's image does not contain ddpjob, so ``runner`` carries this file and ``shared/heartbeat.py`` in
the pod's environment (``DDPJOB_POD_RUNNER``) and ``python3 -c`` loads them (``runner.BOOT``).

In the pod it:

- starts torchrun (its argv is ours), passes its output on to the container's stdout and counts it
  (the size of a sparse file that takes no space: what ``heartbeat`` measures as output);
- on the first node (``PET_NODE_RANK`` 0) runs ``heartbeat.Watch`` at the rendezvous port (UDP), and
  serves its ``watch.json`` over HTTP on ``DDPJOB_WATCH_PORT``, which ``ddpjob status`` reads through
  the API server's pod proxy (no shared filesystem); on the others runs ``heartbeat.Beacon`` toward
  the master's address (``PET_MASTER_ADDR``, the operator's or Trainer's);
- with ``stall.action: fail``, ends torchrun when the watch says the run stalled, prints the verdict
  (``STALL_LINE``, read back by ``status``) and exits ``STALL_EXIT`` (124, within 1-127: the
  operator's ``ExitCode`` policy fails the job rather than recreating the pod);
- where the runtime restarts the pod after that (a TrainJob: JobSet's OnFailure), keeps the verdict in
  ``DDPJOB_STALL_MARK`` (an emptyDir volume, which outlives the container); a runner that starts and
  finds it says the verdict again and exits ``STALL_EXIT`` without starting torchrun, until the Job's
  backoffLimit fails the job;
- passes SIGTERM and SIGINT on to torchrun (the kubelet stops a pod with SIGTERM to this process).
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STALL_EXIT = 124  # "timed out", as timeout(1) says it; 1-127: not retried under restartPolicy ExitCode
STALL_LINE = "[ddpjob] stall.action fail: "  # then the watch's verdict; status reads it from the pod's log
STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL if torchrun hangs in a collective


def _shared(name: str) -> Any:
    """The bundle's copy of ``launcher.targets.shared.<name>`` (in a pod), else the package's."""
    return sys.modules.get(f"ddpjob_{name}") or importlib.import_module(f"launcher.targets.shared.{name}")


# The folder's names (shared/runfolder.py, which the bundle carries first): where the watch is served.
WATCH_PATH: str = _shared("runfolder").WATCH_URL_PATH


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
        self.mark = env.get("DDPJOB_STALL_MARK") or None  # objects/runner.MARK_ENV
        self.proc: subprocess.Popen[bytes] | None = None
        self.stalled: str | None = None
        self._out = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="ddpjob-pod-")
        own = _shared("runfolder").PodFolder(self.folder)
        self.counted = own.output_count  # sparse: its size is the bytes torchrun wrote
        self.state_path = own.watch
        self.steps_dir = own.vitals  # the trainer's per-rank step reports (DDPJOB_VITALS_DIR)
        # Each rank's vitals (shared/vitals.py), sent with the heartbeats; the output is fed to it as it passes.
        self.sampler = _shared("vitals").Sampler(node=self.node, agent=lambda: self.proc.pid if self.proc else None,
                                                 log=None, steps_dir=self.steps_dir)

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
        if earlier is not None:  # restarted after it ended a stalled run: that run stays ended
            self.say(STALL_LINE + earlier)
            self.say(f"stalled: {earlier} (this pod's runner ended the run; restarted, it does not start torchrun again)")
            return STALL_EXIT
        open(self.counted, "wb").close()
        env = {k: v for k, v in self.env.items() if k != "DDPJOB_POD_RUNNER"}
        os.makedirs(self.steps_dir, exist_ok=True)
        env.setdefault(_shared("vitals").VITALS_DIR_ENV, self.steps_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            self.say(f"cannot start {self.argv[0]}: {exc}")
            return 127
        pump = threading.Thread(target=self._pump, name="ddpjob-output", daemon=True)
        pump.start()
        beat, _server = self._heartbeats()
        code = self.proc.wait()
        pump.join(timeout=5)
        if beat is not None:
            beat.stop()
        # The pod ends at once (the server's and heartbeat's threads are daemons): the controller
        # ends the job on the first pod's exit, so a pod that lingers widens the window in which
        # the other pods see the rendezvous store vanish and fail.
        if self.stalled:
            self.say(f"stalled: {self.stalled}")
            return STALL_EXIT
        return code if code >= 0 else 128 - code

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream: Any = self.proc.stdout  # a BufferedReader: read1 returns what is there, not 64 kB
        total = 0
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._out:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            total += len(chunk)
            self.sampler.saw(chunk, time.time())  # a line cut between two chunks may go unseen: ages are samples
            try:
                os.truncate(self.counted, total)
            except OSError:
                pass

    def _heartbeats(self) -> tuple[Any, ThreadingHTTPServer | None]:
        """The watch (first node) or a beacon (the others), as ``slurm/node.py`` starts them."""
        heartbeat = _shared("heartbeat")
        host = os.uname().nodename
        if self.node != 0:
            beacon = heartbeat.Beacon(addr=self.addr, port=self.port, node=self.node, host=host, outputs=[self.counted],
                                      timeout=self.timeout, action=self.action, on_stall=self._on_stall,
                                      vitals=self.sampler.sample)
            beacon.start()
            return beacon, None
        outputs = [self.counted]
        if self.env.get("DDPJOB_METRICS_FILE"):
            outputs.append(self.env["DDPJOB_METRICS_FILE"])
        watch = heartbeat.Watch(port=self.port, nodes=self.nodes, host=host, outputs=outputs, state_path=self.state_path,
                                timeout=self.timeout, action=self.action, on_stall=self._on_stall,
                                vitals=self.sampler.sample)
        why = watch.start()
        if why:
            self.say(why)
            return None, None
        return watch, self._serve()

    def _serve(self) -> ThreadingHTTPServer | None:
        """``watch.json`` on ``DDPJOB_WATCH_PORT`` (GET /watch.json), for the API server's pod proxy."""
        if not self.watch_port:
            return None
        state_path = self.state_path

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                try:
                    with open(state_path, "rb") as f:
                        data, code = f.read(), 200
                except OSError:
                    data, code = b'{"error": "no ' + WATCH_PATH[1:].encode() + b' yet"}', 404
                if self.path.split("?")[0] != WATCH_PATH:
                    data, code = b'{"error": "not found"}', 404
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        try:
            server = ThreadingHTTPServer(("", self.watch_port), Handler)
        except OSError as exc:
            self.say(f"stall watch not served: TCP port {self.watch_port} ({exc}); status cannot read it")
            return None
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="ddpjob-watch-http", daemon=True).start()
        return server

    def _on_stall(self, message: str) -> None:
        """stall.action is fail: say why, then stop torchrun (SIGTERM, SIGKILL ``STOP_GRACE_S`` later)."""
        if self.stalled is not None:
            return
        self.stalled = message
        self.say(STALL_LINE + message)
        if self.mark:
            try:
                with open(self.mark + ".tmp", "w", encoding="utf-8") as f:
                    f.write(message)
                os.replace(self.mark + ".tmp", self.mark)
            except OSError as exc:
                self.say(f"the verdict could not be kept in {self.mark} ({exc}): a restarted pod starts torchrun again")
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        except ProcessLookupError:
            pass

    def _marked(self) -> str | None:
        """The verdict an earlier start of this pod's runner kept (``DDPJOB_STALL_MARK``), if any."""
        if not self.mark:
            return None
        try:
            with open(self.mark, encoding="utf-8") as f:
                return f.read().strip() or "an earlier start of this pod ended a stalled run"
        except OSError:
            return None

    def _forward(self, signum: int, frame: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signum)
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> int:
    """Run torchrun's ``argv`` under the pod runner; torchrun's exit code, or ``STALL_EXIT``. Its own
    folder (output count, watch.json, the trainer's step reports) goes with it: a pod's /tmp may be a
    volume that outlives the pod."""
    runner = PodRunner(argv, dict(os.environ))
    try:
        return runner.run()
    finally:
        shutil.rmtree(runner.folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
