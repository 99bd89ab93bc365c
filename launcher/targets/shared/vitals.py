"""Each rank's vital signs, sampled by its node's runner (the local node wrapper, the Slurm node
runner, the Kubernetes pod runner) beside torchrun. Standard library only; no process per rank: every
few seconds it reads, for each worker process of the node's torchrun agent, ``/proc/PID/stat`` (state,
CPU seconds), ``/proc/PID/statm`` (resident memory) and ``/proc/PID/environ`` (RANK, LOCAL_RANK: read
until both are there, then kept while the process lives);
the new bytes of the node's log (torchrun's ``--tee`` prefixes each worker line with
``[default<local rank>]:``, so the age of each rank's last output); the reference trainer's own step
report (``DDPJOB_VITALS_DIR/rank-<R>.json``, see ``launcher.train.vitals``); and, where ``nvidia-smi``
runs, each GPU's use and memory (one ``nvidia-smi`` call per sample, for the whole node). A rank's own
GPU is the one ``nvidia-smi`` lists its pid on; inside a container, where the driver lists the host's
pids, it is the one the trainer's report names (by UUID), with the memory PyTorch holds there.

A sample is a small dict that travels with the node's heartbeat (``shared.heartbeat``) and is kept in
``watch.json``; ``launcher.targets.shared.health`` reads it back, typed.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from launcher.core.jsondata import JSONObject

# What each sample reads of a node's log at most: a node that prints faster is read from its tail.
LOG_CHUNK = 1 << 20
VITALS_DIR_ENV = "DDPJOB_VITALS_DIR"
_PREFIX = re.compile(rb"^\[default(\d+)\]:", re.M)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
GPU_EVERY_S = 6.0  # nvidia-smi is a process: asked at most this often
# An nvidia-smi that failed or hung (a GPU fault can do that) is asked again only after this long: the
# sample runs in the heartbeat's thread, which it must not hold up every time.
GPU_RETRY_S = 60.0
SMI_TIMEOUT_S = 5.0
_SMI_FAILED = "no GPU (nvidia-smi failed"
STATES = {"R": "running", "S": "sleeping", "D": "disk wait", "T": "stopped", "t": "stopped (traced)", "Z": "zombie", "X": "ended"}


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), in the order the kernel lists them."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def proc_stat(pid: int) -> tuple[str, float] | None:
    """(state letter, CPU seconds used) of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    return fields[0].decode(), (int(fields[11]) + int(fields[12])) / _TICK


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def ranks_of(pid: int) -> tuple[int | None, int | None]:
    """(RANK, LOCAL_RANK) from the process's environment; None where not readable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return None, None

    def num(key: bytes) -> int | None:
        value = env.get(key, b"")
        return int(value) if value.isdigit() else None

    return num(b"RANK"), num(b"LOCAL_RANK")


def gpus() -> tuple[list[dict[str, object]], dict[int, dict[str, object]], str | None]:
    """(each GPU's index, use % and memory in MiB; per process pid, its GPU index and memory; why there
    is none, or None) from one ``nvidia-smi`` call each for devices and processes."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], {}, "no GPU (nvidia-smi not found)"
    try:
        dev = subprocess.run([smi, "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True)
        app = subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], {}, f"{_SMI_FAILED}: {exc})"
    devices: list[dict[str, object]] = []
    by_uuid: dict[str, object] = {}
    for line in dev.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            index = int(parts[0]) if parts[0].isdigit() else parts[0]
            by_uuid[parts[1]] = index
            devices.append({"index": index, "uuid": uuid_key(parts[1]), "util": _num(parts[2]), "mem_mib": _num(parts[3]),
                            "total_mib": _num(parts[4])})
    procs: dict[int, dict[str, object]] = {}
    for line in app.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            procs[int(parts[0])] = {"gpu": by_uuid.get(parts[1]), "mem_mib": _num(parts[2])}
    return devices, procs, (None if devices else "no GPU (nvidia-smi lists none)")


def uuid_key(text: str) -> str:
    """A GPU's UUID as 32 lower-case hex digits, whether ``nvidia-smi`` wrote it (``GPU-xxxxxxxx-xxxx-...``)
    or the trainer did (``launcher.train.vitals.gpu_identity``)."""
    text = text.strip().lower()
    return (text[4:] if text.startswith("gpu-") else text).replace("-", "")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class Sampler:
    """One node's sampler: ``sample()`` every few seconds returns the node's vitals (see the module).

    ``agent``: a function giving the pid of the node's torchrun agent (None before it runs);
    ``log``: the node's log; ``steps_dir``: where the trainer reports each rank's steps (or None);
    ``frames``: where each rank's stack has been lately, per pid (``stacks.FrameSampler``), or None."""

    def __init__(self, *, node: int, agent: object, log: str | None, steps_dir: str | None, gpu: bool = True,
                 frames: Callable[[list[int]], dict[int, JSONObject]] | None = None) -> None:
        self.node, self.agent, self.log, self.steps_dir, self.gpu = node, agent, log, steps_dir, gpu
        self.frames = frames
        self._ids: dict[int, tuple[int | None, int | None]] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (time of sample, CPU seconds then)
        self._stopped: dict[int, float] = {}  # pid -> since when it is stopped
        self._output: dict[int, float] = {}  # local rank -> its last output line's time
        self._offset: int | None = None
        self._last: list[dict[str, object]] = []
        self._now: list[dict[str, object]] = []
        self._gpu_next = 0.0
        self._gpu: tuple[list[dict[str, object]], dict[int, dict[str, object]], str | None] = ([], {}, None)

    def live(self) -> list[dict[str, object]]:
        """The ranks the last sample found running (``ddpjob stacks`` reads them)."""
        return [r for r in self._now if r.get("state") not in ("X", "Z")]

    def _agent_pid(self) -> int | None:
        agent = self.agent() if callable(self.agent) else self.agent
        return agent if isinstance(agent, int) and agent > 0 else None

    def sample(self) -> dict[str, object]:
        now = time.time()
        agent = self._agent_pid()
        self._read_log(now)
        if self.gpu and now >= self._gpu_next:
            self._gpu = gpus()
            failed = (self._gpu[2] or "").startswith(_SMI_FAILED)
            self._gpu_next = time.time() + (GPU_RETRY_S if failed else GPU_EVERY_S)  # from when it answered
        devices, gproc, no_gpu = self._gpu if self.gpu else ([], {}, "no GPU (not sampled)")
        ranks = []
        kids = children(agent) if agent else []
        for book in (self._ids, self._cpu, self._stopped):  # what it kept of workers that have ended: a pid
            for gone in set(book) - set(kids):  # used again later (a restarted worker) starts afresh
                del book[gone]
        for pid in kids:
            stat = proc_stat(pid)
            if stat is None:
                continue
            rank, local = self._ids.get(pid) or ranks_of(pid)
            if rank is None or local is None:
                # Not a worker of torchrun (a container engine's process), or one caught between fork and
                # exec, whose environment is still its agent's (which may hold a RANK: the node's, as a
                # PyTorchJob sets it): asked again at the next sample, and kept only once it is a worker.
                continue
            self._ids[pid] = (rank, local)
            state, cpu_s = stat
            last = self._cpu.get(pid)
            self._cpu[pid] = (now, cpu_s)
            cpu = round(100 * (cpu_s - last[1]) / (now - last[0]), 1) if last and now > last[0] else None
            if state in ("T", "t"):
                self._stopped.setdefault(pid, now)
            else:
                self._stopped.pop(pid, None)
            rec: dict[str, object] = {"rank": rank, "local_rank": local, "pid": pid, "state": state, "cpu": cpu,
                                      "rss": _rss(pid), "output": self._output.get(local)}
            if pid in self._stopped:
                rec["stopped_since"] = self._stopped[pid]
            steps = self._steps(rank)
            own = steps.pop("gpu", None)
            if pid in gproc:
                seen: dict[str, object] = {**gproc[pid], "seen_by": "nvidia-smi"}
                if seen.get("mem_mib") is None and isinstance(own, dict):  # the driver says [N/A]: PyTorch's figure
                    seen.update(mem_mib=own.get("reserved_mib"), seen_by="nvidia-smi; memory: trainer")
                rec["gpu"] = seen
            elif isinstance(own, dict) and devices:  # in a container: nvidia-smi's pids are the host's
                index = next((d["index"] for d in devices if d.get("uuid") == uuid_key(str(own.get("uuid")))), None)
                if index is not None:
                    rec["gpu"] = {"gpu": index, "mem_mib": own.get("reserved_mib"), "seen_by": "trainer"}
            if steps:
                rec["steps"] = steps
            ranks.append(rec)
        if ranks and self.frames is not None:
            try:
                placed = self.frames([int(str(r["pid"])) for r in ranks])
            except Exception:  # noqa: BLE001 - the frames are extra: the vitals go on without them
                placed = {}
            for r in ranks:
                if int(str(r["pid"])) in placed:
                    r["frames"] = placed[int(str(r["pid"]))]
        self._now = ranks
        if ranks:
            self._last = ranks
        else:  # the ranks have ended (or not yet started): their last sample stays, for top after the end
            ranks = [{**{k: v for k, v in r.items() if k != "stopped_since"}, "state": "X", "cpu": None}
                     for r in self._last]
        out: dict[str, object] = {"node": self.node, "t": now, "ranks": sorted(ranks, key=lambda r: str(r["local_rank"]))}
        if devices:
            out["gpus"] = devices
        else:
            out["no_gpu"] = no_gpu or "no GPU"
        return out

    def _read_log(self, now: float) -> None:
        """The time of each rank's newest output line, from what the log gained since the last sample."""
        if not self.log:
            return
        try:
            with open(self.log, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if self._offset is None or size < self._offset:
                    self._offset = max(0, size - LOG_CHUNK)
                if size - self._offset > LOG_CHUNK:
                    self._offset = size - LOG_CHUNK
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return
        cut = data.rfind(b"\n") + 1  # a line still being written is read whole next time
        self._offset += cut
        self.saw(data[:cut], now)

    def saw(self, data: bytes, now: float) -> None:
        """Output of the node's torchrun (whole lines, each worker's prefixed ``[default<local rank>]:``):
        the time of each rank's newest line. The log's reader calls it; so does a runner that passes the
        output on itself (the Kubernetes pod runner, which has no log file)."""
        for m in _PREFIX.finditer(data):
            self._output[int(m.group(1))] = now

    def _steps(self, rank: int | None) -> dict[str, object]:
        """The trainer's report of this rank's steps (``launcher.train.vitals``), if any; its ``gpu``
        (which GPU, by UUID, and what PyTorch holds there) included."""
        if rank is None or not self.steps_dir:
            return {}
        try:
            with open(os.path.join(self.steps_dir, f"rank-{rank}.json"), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
