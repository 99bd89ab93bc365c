"""Every rank's health, typed, for the client side (``ddpjob top``, the dashboard): read from the
first node's ``watch.json`` (written by ``shared.heartbeat``'s ``Watch`` with each node's vitals from
``shared.vitals``). ``heartbeat.report`` says the same in one line for ``status`` and ``list``; this
module gives every field, rank by rank. Standard library only; nothing here starts a process."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from launcher.targets.shared.heartbeat import report
from launcher.targets.shared.vitals import STATES

if TYPE_CHECKING:
    from launcher.core.jsondata import JSON, JSONObject


@dataclass
class RankVitals:
    """One rank as its node's runner last saw it. ``output_age_s``: seconds since its last output
    line (None: none yet); ``step_ms``/``own_ms``: the trainer's wall time per step and its own work
    in it (data + compute), None for a program that does not report steps; ``gpu``: its GPU index,
    use % and memory in MiB, None where it has none; ``gpu_seen_by``: "nvidia-smi" (the memory is
    the process's), "trainer" (inside a container, the memory PyTorch holds) or "nvidia-smi; memory:
    trainer" (the driver gives no process's memory: PyTorch's figure)."""

    rank: int | None
    local_rank: int | None
    pid: int
    state: str
    cpu_pct: float | None
    rss_bytes: int | None
    output_age_s: float | None
    stopped_since: float | None = None
    step: int | None = None
    step_ms: float | None = None
    own_ms: float | None = None
    data_ms: float | None = None
    compute_ms: float | None = None
    comm_ms: float | None = None
    gpu: int | str | None = None
    gpu_util: float | None = None
    gpu_mem_mib: float | None = None
    gpu_seen_by: str | None = None
    flag: str = ""  # "stuck", "straggler" or ""
    exit_code: int | None = None  # once its node has ended: 0 when its node's torchrun ended 0 (every rank did)


@dataclass
class NodeVitals:
    node: int
    host: str | None
    heard_age_s: float | None  # seconds since the first node last heard it
    sampled: float | None  # when its vitals were sampled (time.time())
    ranks: list[RankVitals]
    gpus: list[JSONObject] = field(default_factory=list)  # the node's GPUs as its sampler saw them
    no_gpu: str | None = None  # why there are no GPU columns ("no GPU (nvidia-smi not found)")
    error: str | None = None
    ended: str | None = None  # how its torchrun ended, once it has: "exit 0", "exit 1", "SIGTERM"
    # Seconds the watch had gone without hearing this node when it last wrote, once that is past
    # SILENT_AFTER_S (its runner frozen, cut off or gone): its rows are its last sample, not the present.
    silent_s: float | None = None


@dataclass
class JobHealth:
    """One run's health: ``note`` is what ``status`` says (None when all is well); ``updated``: when
    the watch last wrote (a run that ended keeps its last sample)."""

    task: int
    updated: float | None
    timeout: float | None
    action: str | None
    nodes: list[NodeVitals]
    note: str | None
    stragglers: list[JSONObject] = field(default_factory=list)  # ``watch.json``'s, as the watch wrote them
    verdict: JSONObject | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _dict(value: object) -> JSONObject:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[JSON]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(state: JSONObject, task: int = 0, now: float | None = None,
          ends: dict[int, JSON] | None = None) -> JobHealth:
    """``watch.json``'s content as a ``JobHealth`` (anything missing or malformed left None). ``ends``:
    per node, the record of how its torchrun ended, where one is kept (the local node wrapper's): the
    ranks of a node that has ended are shown "exited", whatever its last sample said mid-run."""
    now = time.time() if now is None else now
    verdict = _dict(state.get("verdict")) or None
    slow = [s for s in _list(state.get("stragglers")) if isinstance(s, dict)]
    slow_ranks = {s.get("rank") for s in slow}
    stuck = verdict.get("rank") if verdict and verdict.get("kind") == "stuck" else None
    nodes = []
    for rec in _list(state.get("nodes")):
        if not isinstance(rec, dict):
            continue
        v = _dict(rec.get("vitals"))
        ranks = []
        for r in _list(v.get("ranks")):
            pid = _int(r.get("pid")) if isinstance(r, dict) else None
            if not isinstance(r, dict) or pid is None:
                continue
            steps, gpu = _dict(r.get("steps")), _dict(r.get("gpu"))
            devices = {_key(d.get("index")): d for d in _list(v.get("gpus")) if isinstance(d, dict)}
            used = gpu.get("gpu")
            device = used if isinstance(used, (int, str)) and not isinstance(used, bool) else None
            data, compute = _num(steps.get("data_ms")), _num(steps.get("compute_ms"))
            out = _num(r.get("output"))
            rank = _int(r.get("rank"))
            ranks.append(RankVitals(
                rank=rank, local_rank=_int(r.get("local_rank")), pid=pid,
                state=STATES.get(str(r.get("state")), str(r.get("state"))), cpu_pct=_num(r.get("cpu")),
                rss_bytes=_int(r.get("rss")), output_age_s=round(now - out, 1) if out else None,
                stopped_since=_num(r.get("stopped_since")), step=_int(steps.get("step")),
                step_ms=_num(steps.get("step_ms")), own_ms=data + compute if data is not None and compute is not None
                else None, data_ms=data, compute_ms=compute, comm_ms=_num(steps.get("comm_ms")),
                gpu=device, gpu_util=_num((devices.get(_key(used)) or {}).get("util")),
                gpu_mem_mib=_num(gpu.get("mem_mib")), gpu_seen_by=_str(gpu.get("seen_by")),
                flag="stuck" if rank is not None and rank == stuck else "straggler" if rank in slow_ranks else ""))
        ended = _ended((ends or {}).get(_int(rec.get("node")) or 0))
        if ended is not None:
            for seen in ranks:
                seen.state, seen.cpu_pct, seen.exit_code = "exited", None, 0 if ended == "exit 0" else None
        heard, updated = _num(rec.get("heard")), _num(state.get("updated"))
        quiet = updated - heard if heard and updated else None  # the watch's own clock, both
        nodes.append(NodeVitals(
            node=_node(rec.get("node")), host=_str(rec.get("host")),
            heard_age_s=round(now - heard, 1) if heard else None, sampled=_num(v.get("t")), ranks=ranks,
            gpus=[d for d in _list(v.get("gpus")) if isinstance(d, dict)],
            no_gpu=_str(v.get("no_gpu")), error=_str(v.get("error")), ended=ended,
            silent_s=round(quiet, 1) if quiet is not None and quiet > SILENT_AFTER_S and ended is None else None))
    return JobHealth(task=task, updated=_num(state.get("updated")), timeout=_num(state.get("timeout")),
                     action=_str(state.get("action")), nodes=nodes,
                     note=report(state, now), stragglers=slow, verdict=verdict)


def _key(value: JSON) -> object:
    """A GPU's index as a key (a list or an object, which no sampler writes, as None)."""
    return None if isinstance(value, (dict, list)) else value


def _node(value: JSON) -> int:
    """``int(value or 0)`` as the node's number: anything that is not one reads as node 0."""
    try:
        return int(value or 0) if isinstance(value, (int, float, str)) else 0
    except ValueError:
        return 0


def exit_records(nodes: list[tuple[str, str]]) -> dict[int, JSON]:
    """Per node, the record of how its torchrun ended (``launcher.targets.local.job.node``: beside its log,
    ``node-<n>.exit.json``), from each node's (log, torchrun log folder); None where there is none."""
    import json

    from launcher.targets.shared.runfolder import exit_file

    out: dict[int, JSON] = {}
    for n, (log, _) in enumerate(nodes):
        try:
            with open(exit_file(log), encoding="utf-8") as f:
                out[n] = json.load(f)
        except (OSError, ValueError):
            out[n] = None
    return out


def _ended(record: JSON) -> str | None:
    """How a node's torchrun ended, from its exit record (``{"exit_code": ..., "signal": ...}``); None
    while it runs (or with no record)."""
    known = _dict(record)
    signal = known.get("signal")
    if isinstance(signal, str):
        return signal
    code = _int(known.get("exit_code"))
    return None if code is None else f"exit {code}"


SILENT_AFTER_S = 10.0  # five heartbeats (heartbeat.INTERVAL_S) missed
COLUMNS = ("NODE", "RANK", "PID", "STATE", "CPU%", "RSS", "OUTPUT", "STEP", "STEP MS", "OWN MS", "GPU", "GPU%",
           "GPU MEM", "")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def _f(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def rows(health: JobHealth) -> list[tuple[str, ...]]:
    """One row per rank, node by node (``COLUMNS``), as ``ddpjob top`` and the dashboard show them; a
    node without GPUs says why in its GPU column ("no GPU"), a node with no rank seen has one row
    saying so."""
    out: list[tuple[str, ...]] = []
    for n in health.nodes:
        where = f"{n.node}" + (f" {n.host}" if n.host else "")
        no_gpu = "no GPU" if n.no_gpu or not n.gpus else ""
        if not n.ranks:
            why = n.error or ("no vitals yet" if n.sampled is None else "no rank seen (not started yet, or ended)")
            out.append((where, "-", "-", why, *["-"] * 9, ""))
            continue
        for r in sorted(n.ranks, key=lambda r: (r.rank is None, r.rank or 0)):
            since = f" since {time.strftime('%H:%M:%S', time.localtime(r.stopped_since))}" if r.stopped_since else ""
            if r.state == "exited":  # the rank's own code where it is known, else its node's torchrun's
                since = f" {r.exit_code}" if r.exit_code is not None else f" (node {n.ended})"
            flag = r.flag.upper() or (f"SILENT {n.silent_s:.0f}s" if n.silent_s is not None else "")
            out.append((
                where, _f(r.rank) if r.rank is not None else "?", str(r.pid), r.state + since, _f(r.cpu_pct),
                _size(r.rss_bytes), "never" if r.output_age_s is None else f"{r.output_age_s:.0f}s ago", _f(r.step),
                _f(r.step_ms, "{:.1f}"), _f(r.own_ms, "{:.1f}"), no_gpu or ("-" if r.gpu is None else str(r.gpu)),
                "" if no_gpu else _f(r.gpu_util), "" if no_gpu else _f(r.gpu_mem_mib, "{:.0f} MiB"), flag))
    return out


def notes(health: JobHealth) -> list[str]:
    """What the table's GPU columns leave out, a line each: every node's GPUs (use and memory of the
    whole device); a node whose ranks nvidia-smi does not list; why a node has no GPU columns."""
    out: list[str] = []
    for n in health.nodes:
        if n.silent_s is not None:
            out.append(f"node {n.node}{f' ({n.host})' if n.host else ''}: not heard for {n.silent_s:.0f}s when the watch "
                       "last wrote (its runner frozen, cut off or gone): its rows are its last sample, not the present")
        if n.gpus:
            out.append(f"node {n.node} GPUs: " + "; ".join(
                f"#{d.get('index')} {_f(_num(d.get('util')))}% busy, {_gib(d.get('mem_mib'))} of {_gib(d.get('total_mib'))} GiB"
                for d in n.gpus))
            if n.ranks and all(r.gpu is None for r in n.ranks):
                out.append(f"node {n.node}: nvidia-smi lists none of its ranks' processes (in a container it lists the "
                           "host's pids; ddpjob's trainer on a GPU names its own)")
    return out + sorted({n.no_gpu for n in health.nodes if n.no_gpu})


def _gib(mib: JSON) -> str:
    value = _num(mib)
    return "-" if value is None else f"{value / 1024:.1f}"


def table(health: JobHealth) -> list[str]:
    """``rows`` as aligned text lines, the header first."""
    body = [COLUMNS, *rows(health)]
    widths = [max(len(row[i]) for row in body) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in body]
