"""Logs of a PyTorchJob's (or TrainJob's) pods: streamed concurrently, prefixed by replica and rank,
persisted locally.

Pods are found by the operator's label ``training.kubeflow.org/job-name`` (a TrainJob's by JobSet's
``jobset.sigs.k8s.io/jobset-name``; their container is ``node``). Every line read from the
API is also written under the job's run directory, one file per container run::

    pods/<pod>/<pod created>-<pod uid[:8]>-r<restart count>.log

so ``ddpjob logs ID`` still shows everything after the pods are gone (cleanPodPolicy, TTL, the
ExitCode policy recreating pods, a deleted job). A per-pod lock file lets one follower own a pod's
files; a second reader at the same time streams without writing, so files never get lines twice.

Contract of ``logs`` (see ``Target.logs``):
1. Without follow: for every pod that exists and has started, fetch its current log (and the
   previous run's after a restart) and persist it; then print every persisted file: pods that are
   gone included. A job whose pods are all Pending prints nothing.
2. With follow: print persisted runs first, then stream every pod in its own thread (a queue to the
   caller). Pending pods are picked up when they start (the pod list is polled); after an in-place
   restart the previous run is fetched and the new one streamed. Stop once the job is terminal and
   every stream has ended (at most ``DRAIN_GRACE`` seconds later).
3. ``tail=N``: the last N lines of each pod that exist when the call starts.
4. Lines keep their order within a pod; pods interleave.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from launcher.core.errors import DdpjobError
from launcher.core.jsondata import JSONObject, at, obj
from launcher.targets.base import LogFilter
from launcher.targets.k8s.cluster.client import Kube
from launcher.targets.k8s.cluster.pods import (
    LogStream,
    PodLock,
    PodRef,
    attempt_file,
    close,
    container,
    name_of,
    path_uid,
    pod_ref,
    reached,
    read_chunks,
    restart_count,
    sort_key,
    started,
)
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi
from launcher.targets.shared.files import atomic_write
from launcher.targets.shared.logtail import AgentNoise, LogSource, format_line, hidden_rank_line, split_torchrun_prefix
from launcher.targets.shared.runfolder import RunFolder

POLL = 0.5
DRAIN_GRACE = 15.0
OUTAGE_LIMIT = 120.0


def _done_mark(attempt: Path) -> Path:
    """Beside an attempt file: the run it holds has ended and was saved whole."""
    return attempt.with_name(attempt.name + ".done")


class PodLogs:
    """Log reader for one ddpjob job (all its PyTorchJobs)."""

    def __init__(self, kube: Kube | None, run_dir: str, elements: Sequence[Mapping[str, object]], procs_per_node: int,
                 flt: LogFilter, elastic: bool = False, api: KubeflowApi = PYTORCHJOB) -> None:
        self.kube = kube
        self.api = api  # how the pods are selected, and which container is the trainer
        self.pods_dir = Path(RunFolder(run_dir).pods)
        self.elements = [e for e in elements if flt.task is None or e["index"] == flt.task]
        self.multi = len(elements) > 1
        self.procs = procs_per_node
        self.flt = flt
        # Elastic jobs get their node ranks at rendezvous, so a replica's index says nothing about
        # its ranks: lines keep torchrun's own [default<local rank>]: prefix instead.
        self.elastic = elastic
        self.noise: dict[str, AgentNoise] = {}  # per pod: torchrun's own tracebacks span lines

    # ------------------------------------------------------------------ shared helpers
    def _ref(self, pod_name: str) -> PodRef | None:
        ref = pod_ref(pod_name, self.elements, self.multi)
        if ref is None or (self.flt.node is not None and ref.node != self.flt.node):
            return None
        return ref

    def _source(self, ref: PodRef) -> LogSource:
        return LogSource(str(self.pods_dir / ref.name), ref.label, ref.node, self.procs, ref.task)

    def _fmt(self, ref: PodRef, line: str) -> str | None:
        local_rank, text = split_torchrun_prefix(line)
        if not self.flt.verbose and local_rank is None:  # the agent's own line
            kept = self.noise.setdefault(ref.name, AgentNoise()).show(line)
            if kept is None:
                return None
            line = kept
        elif not self.flt.verbose and hidden_rank_line(text):
            return None
        if self.elastic:
            return f"[{ref.label}] {line}"
        return format_line(self._source(ref), line, self.flt.rank)

    def _live_pods(self) -> list[JSONObject]:
        if self.kube is None:
            return []
        pods = []
        for el in self.elements:
            pods += self.kube.list_pods(self.api.pod_selector(str(el["name"])))
        return sorted(pods, key=lambda p: sort_key(name_of(p)))

    def _persisted(self) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        if not self.pods_dir.is_dir():
            return out
        for pod_dir in sorted(self.pods_dir.iterdir(), key=lambda p: sort_key(p.name)):
            if pod_dir.is_dir() and self._ref(pod_dir.name) is not None:
                out[pod_dir.name] = sorted(pod_dir.glob("*.log"))
        return out

    # ------------------------------------------------------------------ without follow
    def snapshot(self) -> Iterator[str]:
        try:
            live = self._live_pods()
        except DdpjobError as e:
            if not self._persisted():
                raise
            # The cluster is out of reach: say so once, then serve what was saved.
            yield f"[ddpjob] showing saved logs only: {str(e).splitlines()[0]}"
            live = []
        for pod in live:
            name = name_of(pod)
            if self._ref(name) is None:
                continue
            cs = container(pod, self.api.container)
            if not started(cs):
                continue
            lock = PodLock(self.pods_dir / name)
            try:
                if lock.held:  # else a follower is writing this pod's files as we speak
                    self._save_runs(name, pod, restart_count(cs))
            finally:
                lock.release()
        for pod_name, files in self._persisted().items():
            yield from self._saved_lines(pod_name, files)

    def _save_runs(self, name: str, pod: JSONObject, restarts: int) -> None:
        """Save the pod's current run and the whole run before it, each to its own attempt file.

        A run saved while it ran is incomplete once it has ended, so the run before the current one
        is fetched whole (the API's previous log) until a ``.done`` mark says that was done. The
        status (``restarts``) and the logs are read apart, and a container restarted in between
        would put the new run's lines in the old run's file: the restart count is read again after
        the logs, and nothing is written when it moved (the next read takes the new run).
        """
        data = reached(self.kube).pod_log(name)
        prev = attempt_file(self.pods_dir, pod, restarts - 1) if restarts else None
        old = None
        if prev is not None and not _done_mark(prev).exists():
            old = reached(self.kube).pod_log(name, previous=True)
        now = reached(self.kube).get_pod(name)  # None: deleted meanwhile, which starts no new run
        if now is not None and restart_count(container(now, self.api.container)) != restarts:
            return
        if prev is not None and old is not None:
            atomic_write(prev, old)
            _done_mark(prev).touch()
        current = attempt_file(self.pods_dir, pod, restarts)
        if data is not None and not _done_mark(current).exists():  # a status behind the kubelet's
            atomic_write(current, data)

    def _saved_lines(self, pod_name: str, files: list[Path]) -> Iterator[str]:
        """A pod's persisted lines (its attempts in order), honouring --tail, formatted and filtered."""
        ref = self._ref(pod_name)
        assert ref is not None
        lines = [ln for f in files for ln in f.read_bytes().decode("utf-8", "replace").splitlines()]
        shown = [out for line in lines if (out := self._fmt(ref, line)) is not None]  # then the tail: of those shown
        if self.flt.tail is not None:
            shown = list(deque(shown, maxlen=self.flt.tail)) if self.flt.tail > 0 else []
        yield from shown

    # ------------------------------------------------------------------ with follow
    def follow(self, finished: Callable[[], bool]) -> Iterator[str]:
        q: queue.Queue[tuple[PodRef, str]] = queue.Queue()
        stop = threading.Event()
        threads: dict[str, threading.Thread] = {}
        responses: list[LogStream] = []
        live_names = {name_of(p) for p in self._live_pods()}
        # Pods that are gone: what was persisted is all there is.
        for pod_name, files in self._persisted().items():
            if pod_name not in live_names:
                yield from self._saved_lines(pod_name, files)
        done_at: float | None = None
        failing_since: float | None = None
        next_poll = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + POLL * 2
                    try:
                        if done_at is None and finished():
                            done_at = now
                        live = self._live_pods() if done_at is None or now - done_at < 1.0 else []
                        failing_since = None
                    except DdpjobError:
                        # A blip of the API server must not end a long follow; a lasting outage does.
                        failing_since = failing_since or now
                        if now - failing_since > OUTAGE_LIMIT:
                            raise
                        live = []
                    for pod in live:
                        name = name_of(pod)
                        ref = self._ref(name)
                        if ref is not None and name not in threads:
                            t = threading.Thread(target=self._stream_pod, args=(ref, q, stop, responses),
                                                 daemon=True, name=f"ddpjob-log-{name}")
                            threads[name] = t
                            t.start()
                try:
                    ref, line = q.get(timeout=0.1)
                    out = self._fmt(ref, line)
                    if out is not None:
                        yield out
                    continue
                except queue.Empty:
                    pass
                if done_at is not None:
                    alive = [t for t in threads.values() if t.is_alive()]
                    if (not alive and q.empty()) or time.monotonic() - done_at > DRAIN_GRACE:
                        break
        finally:
            stop.set()
            for resp in responses:
                close(resp)
            for t in threads.values():
                t.join(timeout=2.0)
        while not q.empty():
            ref, line = q.get_nowait()
            out = self._fmt(ref, line)
            if out is not None:
                yield out

    def _stream_pod(self, ref: PodRef, q: queue.Queue[tuple[PodRef, str]], stop: threading.Event, responses: list[LogStream]) -> None:
        pod_dir = self.pods_dir / ref.name
        lock = PodLock(pod_dir)
        try:
            self._stream_pod_locked(ref, q, stop, responses, lock.held)
        except Exception as e:  # noqa: BLE001 - one pod's failure must not stop the others
            q.put((ref, f"[ddpjob] log stream of {ref.name} ended: {type(e).__name__}: {e}"))
        finally:
            lock.release()

    def _stream_pod_locked(self, ref: PodRef, q: queue.Queue[tuple[PodRef, str]], stop: threading.Event,
                           responses: list[LogStream], persist: bool) -> None:
        sent: dict[Path, int] = {}
        tail = self.flt.tail
        first_attempt = True
        pod = reached(self.kube).get_pod(ref.name)
        done = self._replay_older_runs(ref, pod, q)
        while not stop.is_set():
            if pod is None:
                return  # deleted: its lines so far are persisted
            cs = container(pod, self.api.container)
            if not started(cs):
                stop.wait(POLL)
                pod = reached(self.kube).get_pod(ref.name)
                continue
            assert cs is not None
            restarts = restart_count(cs)
            if restarts:
                self._previous_run(ref, pod, restarts, q, done, persist)
            path = attempt_file(self.pods_dir, pod, restarts)
            if path not in done:
                skip_below = 0
                if first_attempt and tail is not None:
                    existing_now = reached(self.kube).pod_log(ref.name) or b""
                    skip_below = max(0, len(existing_now.splitlines()) - tail)
                first_attempt = False
                self._stream_attempt(ref, path, q, stop, responses, persist, sent, skip_below)
            pod = reached(self.kube).get_pod(ref.name)
            if pod is None:
                return
            cs = container(pod, self.api.container)
            state = obj((cs or {}).get("state"))
            same_run = cs is not None and restart_count(cs) == restarts and \
                attempt_file(self.pods_dir, pod, restarts) == path
            if same_run and "terminated" in state:
                if path not in done:
                    done.add(path)
                    # One last read after the exit: the stream may have ended before its last bytes.
                    self._stream_attempt(ref, path, q, stop, responses, persist, sent, 0, whole=True)
                if at(pod, "status", "phase") in ("Succeeded", "Failed"):
                    return
                stop.wait(POLL)  # about to be restarted in place
            elif not same_run:
                if path not in done and (cs or {}).get("restartCount") == restarts + 1 and \
                        at(pod, "metadata", "uid") == path_uid(path, pod):
                    # Restarted in place: the rest of the run we were reading is now the previous log.
                    self._stream_attempt(ref, path, q, stop, responses, persist, sent, 0, whole=True, previous=True)
                done.add(path)  # the next loop takes the new run
            else:
                stop.wait(POLL)  # the stream broke while the container runs: reconnect

    def _replay_older_runs(self, ref: PodRef, pod: JSONObject | None, q: queue.Queue[tuple[PodRef, str]]) -> set[Path]:
        """Queue the runs persisted earlier (by another reader, or a previous call) before the current
        one, once, honouring ``tail``; returns their files, which need no more reading."""
        existing = sorted((self.pods_dir / ref.name).glob("*.log"))
        current = None
        cs = container(pod, self.api.container) if pod is not None else None
        if pod is not None and started(cs):
            current = attempt_file(self.pods_dir, pod, restart_count(cs))
        older = [f for f in existing if f != current]
        old_lines = [ln for f in older for ln in f.read_bytes().decode("utf-8", "replace").splitlines()]
        tail = self.flt.tail
        if tail is not None:
            old_lines = old_lines[-tail:] if tail > 0 else []
        for line in old_lines:
            q.put((ref, line))
        return set(older)

    def _previous_run(self, ref: PodRef, pod: JSONObject, restarts: int, q: queue.Queue[tuple[PodRef, str]],
                      done: set[Path], persist: bool) -> None:
        """After an in-place restart: the run before the current one, from its file or the API."""
        prev = attempt_file(self.pods_dir, pod, restarts - 1)
        if prev in done:
            return
        done.add(prev)
        if prev.exists():
            data = prev.read_bytes()
        else:
            data = reached(self.kube).pod_log(ref.name, previous=True) or b""
            if persist and data:
                atomic_write(prev, data)
        for line in data.decode("utf-8", "replace").splitlines():
            q.put((ref, line))

    def _stream_attempt(self, ref: PodRef, path: Path, q: queue.Queue[tuple[PodRef, str]], stop: threading.Event,
                        responses: list[LogStream], persist: bool, sent: dict[Path, int], skip_below: int,
                        whole: bool = False, previous: bool = False) -> bool:
        """Read the run's log from its start, passing on only lines not sent before; True at its end."""
        if whole:
            data = reached(self.kube).pod_log(ref.name, previous=previous)
            if data is None:
                return True
            chunks: Iterable[bytes] = [data]
            resp = None
        else:
            resp = reached(self.kube).stream_log(ref.name)
            if resp is None:
                stop.wait(POLL)
                return False
            responses.append(resp)
            chunks = read_chunks(resp)
        already = sent.get(path, 0)
        n = 0
        out = None
        if persist:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = open(path, "ab" if already else "wb")  # noqa: SIM115 - closed below
        buf = b""
        try:
            for chunk in chunks:
                if stop.is_set():
                    return False
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    n += 1
                    if n <= already:
                        continue
                    if out is not None:
                        out.write(raw + b"\n")
                        out.flush()
                    sent[path] = n
                    if n > skip_below:
                        q.put((ref, raw.decode("utf-8", "replace")))
            if buf:
                n += 1
                if n > already:
                    if out is not None:
                        out.write(buf + b"\n")
                    sent[path] = n
                    if n > skip_below:
                        q.put((ref, buf.decode("utf-8", "replace")))
        except Exception:  # noqa: BLE001 - a broken stream is reconnected by the caller
            return False
        finally:
            if out is not None:
                out.close()
            if resp is not None:
                close(resp)
                if resp in responses:
                    responses.remove(resp)
        return True
