"""The program ``ddpjob doctor`` runs on every rank: what each rank sees, and all-reduce speed.

``python -m launcher.doctor.probe [--max-mib 256] [--iters 3]`` under torchrun (any target). Every
rank reports its backend, its NCCL/Gloo/rendezvous variables, network interfaces with their
addresses and its own address toward the rendezvous host, GPUs and torch,
CUDA and NCCL versions; rank 0 gathers them, times ``all_reduce`` on float32 tensors from 1 MiB up
to ``--max-mib`` (x4 each step) and prints one line ``[ddpjob-doctor] {json}`` that the launcher
reads back from the logs. Bandwidths as nccl-tests report them: algbw = bytes / time, busbw =
algbw * 2(n-1)/n (what each link carries in a ring all-reduce).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import time
from typing import TYPE_CHECKING

from launcher.targets.shared import netif

if TYPE_CHECKING:
    import torch

MARKER = "[ddpjob-doctor]"
_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "MASTER_", "OMP_NUM_THREADS",
                 "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def rank_info(backend: str, device: torch.device | None = None, note: str | None = None) -> dict[str, object]:
    import torch

    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]  # torch leaves it untyped
        except Exception:  # noqa: BLE001 - a build without NCCL
            nccl = None
    return {
        "rank": int(os.environ.get("RANK", "0")), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "host": socket.gethostname(), "backend": backend, "python": platform.python_version(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "gpus": gpus,
        "device": str(device) if device is not None else None, "note": note,
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        **_network(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }


def _network() -> dict[str, object]:
    """This rank's IPv4 addresses per interface, its own address (and interface) toward MASTER_ADDR,
    and the speed of the link it uses (``link``: the interface NCCL is told to use, else that one)."""
    out: dict[str, object] = {"addresses": {n: a for n, a in sorted(netif.interfaces().items()) if a}}
    used: str | None = None  # the interface toward MASTER_ADDR
    try:
        master, own, used = netif.route_to(os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT") or 9))
        out.update(master_ip=master, address=own, interface=used)
    except (KeyError, OSError, ValueError):
        pass
    named = os.environ.get("NCCL_SOCKET_IFNAME", "")
    link = named.lstrip("=").split(",")[0] if named and not named.startswith("^") else used
    if link:
        out["link"] = {"interface": link, "mbits": link_mbits(link)}
    return out


def link_mbits(name: str) -> int | None:
    """The speed of interface ``name`` on this node in Mbit/s, as its driver reports it in /sys;
    None when it reports none (virtual interfaces: loopback, veth, bridges) or has no such interface."""
    try:
        with open(f"/sys/class/net/{os.path.basename(name)}/speed", encoding="utf-8") as f:
            mbits = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return mbits if mbits > 0 else None


def bench(max_mib: int, iters: int, device: torch.device) -> list[dict[str, float]]:
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    results = []
    mib = 1
    while mib <= max_mib:
        nbytes = mib * 2**20
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        dist.all_reduce(t)  # warm-up: connections, buffers
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        _sync(device)
        elapsed = (time.perf_counter() - start) / iters
        algbw = nbytes / elapsed / 1e9
        results.append({"bytes": nbytes, "iters": iters, "time_us": round(elapsed * 1e6, 1), "algbw_gbps": round(algbw, 4),
                        "busbw_gbps": round(algbw * 2 * (n - 1) / n, 4) if n > 1 else round(algbw, 4)})
        mib *= 4
    return results


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.doctor.probe", description=__doc__.splitlines()[0])
    p.add_argument("--max-mib", type=int, default=256, help="largest all-reduce, in MiB (default 256)")
    p.add_argument("--iters", type=int, default=3, help="timed all-reduces per size (default 3)")
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    from launcher.train.placement import placement_from_env

    # The trainer's rule: one GPU per rank with NCCL; ranks sharing GPUs use Gloo (NCCL refuses them).
    place = placement_from_env(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    device = torch.device("cpu") if place.device_index is None else torch.device("cuda", place.device_index)
    if place.device_index is not None:
        torch.cuda.set_device(device)
    dist.init_process_group(place.backend, device_id=device if place.backend == "nccl" else None)
    infos: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, rank_info(place.backend, device, place.note))
    results = bench(args.max_mib, args.iters, device)
    if dist.get_rank() == 0:
        print(f"{MARKER} " + json.dumps({"world_size": dist.get_world_size(), "ranks": infos, "results": results},
                                        sort_keys=True), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
