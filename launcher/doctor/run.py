"""``ddpjob doctor``: run a real job that checks what the ranks see and how fast they all-reduce.

The job runs ``launcher.doctor.probe`` on the chosen target with the spec's settings (image, env,
NCCL options, resources), so it tests the path a training job will take. Its report comes back
through the job's logs (one ``[ddpjob-doctor] {json}`` line from rank 0), which works the same on
every target. The verdict warns when the ranks disagree on settings that must agree, and when
the bus bandwidth is far below what the network link in use should carry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Protocol

from launcher.core.errors import TargetError
from launcher.core.jsondata import JSON, JSONObject, arr, integer, obj
from launcher.doctor.probe import MARKER
from launcher.targets.base import LogFilter
from launcher.targets.shared import netif

# Settings every rank must share: a difference means ranks will not talk the same way.
_MUST_AGREE = ("backend", "torch", "cuda", "nccl")
_MUST_AGREE_ENV = ("NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_P2P_DISABLE",
                   "NCCL_NET", "MASTER_ADDR", "MASTER_PORT")


class _Logs(Protocol):
    """What ``collect`` asks of the service (``Jobs``): a job's log lines."""

    def logs(self, job_id: str, flt: LogFilter, *, follow: bool = False) -> Iterable[str]: ...


def _ranks(report: JSONObject) -> list[JSONObject]:
    return [obj(r) for r in arr(report.get("ranks"))]


def _results(report: JSONObject) -> list[JSONObject]:
    return [obj(r) for r in arr(report.get("results"))]


def _env(rank: JSONObject) -> JSONObject:
    return obj(rank.get("env"))


def _number(record: JSONObject, key: str) -> float:
    """A number the probe writes (a missing key raises KeyError, as indexing it does)."""
    value = record[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{key} is not a number: {value!r}")
    return value


def probe_command(max_mib: int, iters: int) -> list[str]:
    return ["python", "-m", "launcher.doctor.probe", "--max-mib", str(max_mib), "--iters", str(iters)]


def read_report(lines: list[str]) -> JSONObject:
    """The probe's report from the job's log lines (prefixed with node and rank by ``logs``)."""
    for line in reversed(lines):
        if MARKER in line:
            report: JSON = json.loads(line.split(MARKER, 1)[1])
            return obj(report)
    raise TargetError("the doctor job ended without its report; see its logs (ddpjob logs ID)")


def verdict(report: JSONObject) -> list[str]:
    """Warnings about the report; [] when nothing looks wrong."""
    out = []
    ranks = _ranks(report)
    for key in _MUST_AGREE:
        values = {str(r.get(key)) for r in ranks}
        if len(values) > 1:
            out.append(f"ranks disagree on {key}: {', '.join(sorted(values))}")
    for key in _MUST_AGREE_ENV:
        values = {str(_env(r).get(key, "<unset>")) for r in ranks}
        if len(values) > 1:
            out.append(f"ranks disagree on {key}: {', '.join(sorted(values))}")
    out += _network_warnings(ranks)
    speed = _link_gbps(ranks)
    results = _results(report)
    if speed and results:
        best = max(_number(r, "busbw_gbps") for r in results)
        if best < 0.1 * speed:
            out.append(f"bus bandwidth {best:.2f} GB/s is under 10% of the {speed:.1f} GB/s the network link "
                       "should carry: check NCCL_SOCKET_IFNAME / the interface in use, and NCCL_IB_DISABLE")
    if results and (integer(report.get("world_size")) or 0) > 1 and min(_number(r, "busbw_gbps") for r in results) <= 0:
        out.append("an all-reduce measured no bandwidth")
    shared = next((r["note"] for r in ranks if r.get("note")), None)
    if shared:
        out.append(f"{shared}. NCCL was not checked: run the doctor with one rank per GPU (e.g. --nodes 1 "
                   "--procs-per-node auto) to check it")
    return out


def _link_gbps(ranks: list[JSONObject]) -> float | None:
    """The speed of the slowest link the ranks use (GB/s), as each node's /sys reports it (the probe's
    ``link``); None when a rank's link reports none. A report from an older probe has no ``link``:
    the interface NCCL is told to use, read on this machine, as before."""
    links = [r.get("link") for r in ranks]
    if ranks and all(isinstance(link, dict) for link in links):
        speeds = [link.get("mbits") for link in links if isinstance(link, dict)]
        known = [s for s in speeds if isinstance(s, int) and s > 0]
        return min(known) / 8 / 1000 if len(known) == len(speeds) else None
    from launcher.doctor.probe import link_mbits

    named = str((_env(ranks[0]) if ranks else {}).get("NCCL_SOCKET_IFNAME") or "")
    mbits = link_mbits(named.lstrip("=").split(",")[0]) if named and not named.startswith("^") else None
    return mbits / 8 / 1000 if mbits else None


def _unknown_link(ranks: list[JSONObject]) -> str:
    """Why the link's speed is unknown, and what to do about it."""
    named = {str(_env(r).get("NCCL_SOCKET_IFNAME")) for r in ranks if _env(r).get("NCCL_SOCKET_IFNAME")}
    links = sorted({str(link.get("interface")) for r in ranks if isinstance(link := r.get("link"), dict)
                    and not link.get("mbits")})
    if named and not any(n.startswith("^") for n in named):
        shown = ", ".join(links) or ", ".join(sorted(named))
        return (f"interface {shown} (nccl.socket_ifname) reports no link speed in /sys/class/net/*/speed, as virtual "
                "interfaces (bridges, veth, loopback) do: judge the numbers against the physical link behind it")
    if links:
        return (f"interface {', '.join(links)} in use reports no link speed, as virtual interfaces do; to judge "
                "against another, name it: --set nccl.socket_ifname=IFACE")
    return "the interface in use is unknown; name it: --set nccl.socket_ifname=IFACE"


def node_lines(ranks: list[JSONObject]) -> list[str]:
    """One line per node (host): the rendezvous address it reaches, the address and interface it
    uses toward it, and every interface it has with its address."""
    out: list[str] = []
    seen: set[str] = set()
    for r in ranks:
        host = str(r.get("host"))
        if host in seen:
            continue
        seen.add(host)
        addrs = obj(r.get("addresses")) or dict.fromkeys([str(n) for n in arr(r.get("interfaces"))], "")
        have = ", ".join(f"{n} {a}".rstrip() for n, a in addrs.items())
        toward = (f"to the rendezvous {r.get('master_ip')} from {r.get('address')} via {r.get('interface') or '?'}; "
                  if r.get("address") else "")
        out.append(f"  node {host}: {toward}interfaces {have}")
    return out


def _network_warnings(ranks: list[JSONObject]) -> list[str]:
    hosts = {str(r.get("host")) for r in ranks}
    if len(hosts) < 2:
        return []
    out = []
    for r in ranks:
        own = str(r.get("address") or "")
        if own and netif.is_loopback(own):
            out.append(f"rank {r.get('rank')} on {r.get('host')} reaches the rendezvous over loopback ({own}) although "
                       "the job spans several hosts: the first node's name resolves to a loopback address there")
    return out


def render(report: JSONObject, warnings: JSON) -> list[str]:
    """The text report: who the ranks are, the bandwidth table, the verdict (``warnings``: ``verdict``'s,
    as the report holds them)."""
    ranks = _ranks(report)
    first = ranks[0] if ranks else {}
    out = [f"world size {report.get('world_size')}: backend {first.get('backend')}, torch {first.get('torch')}"
           + (f", CUDA {first['cuda']}" if first.get("cuda") else "") + (f", NCCL {first['nccl']}" if first.get("nccl") else "")]
    for r in ranks:
        gpus = f", GPUs: {', '.join(str(g) for g in arr(r['gpus']))}" if r.get("gpus") else ""
        gpus += f", uses {r['device']}" if str(r.get("device") or "").startswith("cuda") else ""
        via = f", address {r['address']} ({r.get('interface') or '?'})" if r.get("address") else ""
        out.append(f"  rank {r.get('rank')} on {r.get('host')} (local rank {r.get('local_rank')}){via}{gpus}")
    out += node_lines(ranks)
    out.append("")
    out.append(f"{'size':>10}  {'iters':>5}  {'time (us)':>12}  {'algbw (GB/s)':>13}  {'busbw (GB/s)':>13}")
    for r in _results(report):
        out.append(f"{_number(r, 'bytes') / 2**20:>8.0f}Mi  {r.get('iters', '?'):>5}  {r['time_us']:>12.1f}  "
                   f"{r['algbw_gbps']:>13.3f}  {r['busbw_gbps']:>13.3f}")
    out.append("")
    out += [f"warning: {w}" for w in arr(warnings)] or ["verdict: ok: the ranks agree on their settings"]
    if report.get("bandwidth_verdict"):
        out.append(f"bandwidth: {report['bandwidth_verdict']}")
    out += [f"note: {n}" for n in arr(report.get("notes"))]
    return out


def bandwidth_verdict(report: JSONObject) -> str:
    """Whether the bandwidth was judged against the link, and how: ``ok: ...``, ``low: ...``, or
    why it does not apply (loopback: no network link was measured) or could not be judged."""
    ranks = _ranks(report)
    results = _results(report)
    own = sorted({str(r.get("address")) for r in ranks if r.get("address")})
    if own and all(netif.is_loopback(a) for a in own):
        return (f"does not apply: the ranks reach each other over loopback ({', '.join(own)}), so no network "
                "link was measured; run it across hosts (--target slurm or k8s) to judge the network")
    speed = _link_gbps(ranks)
    if not results:
        return "not judged: nothing was measured"
    best = max(_number(r, "busbw_gbps") for r in results)
    if not speed:
        return f"not judged: best busbw {best:.2f} GB/s; the link's speed is unknown: {_unknown_link(ranks)}"
    word = "low" if best < 0.1 * speed else "ok"
    return f"{word}: best busbw {best:.2f} GB/s against the {speed:.1f} GB/s the network link should carry"


def notes(report: JSONObject) -> list[str]:
    """What a reader may wonder about the numbers."""
    out = []
    if report.get("world_size") == 1:
        out.append("with 1 rank nothing crosses a link: a one-rank all-reduce moves no data, so algbw is no "
                   "bandwidth and busbw = algbw x 2(n-1)/n = 0; use 2 or more ranks to measure one")
    if report.get("world_size") == 2:
        out.append("with 2 ranks busbw = algbw x 2(n-1)/n = algbw x 1: the two columns are equal (each rank "
                   "sends and receives the whole buffer once), as nccl-tests report it")
    return out


def collect(jobs: _Logs, job_id: str) -> JSONObject:
    """Read the finished doctor job's report from its logs."""
    lines = list(jobs.logs(job_id, LogFilter(rank=0), follow=False)) or list(jobs.logs(job_id, LogFilter()))
    report = read_report(lines)
    report["job_id"] = job_id
    warnings: list[JSON] = list(verdict(report))
    report["verdict"] = warnings  # the warnings; [] when nothing looks wrong
    report["ok"] = not warnings
    report["bandwidth_verdict"] = bandwidth_verdict(report)
    report["notes"] = list[JSON](notes(report))
    return report


def spec_base(nodes: int | None) -> dict[str, object]:
    return {"name": "doctor", "command": ["python"], "nodes": nodes or 2, "workdir": os.getcwd()}
