"""A tiny DDP program for the Slurm tests: records who it is, optionally all-reduces with gloo.

Writes ``$DDPJOB_OUTPUT_DIR/rank-<RANK>.json`` with rank, world size, host, the rendezvous
endpoint torchrun gave it and its arguments (to prove hostile strings arrive literally).

Options: ``--allreduce`` (init a gloo process group and sum the ranks), ``--sleep S`` (stay alive,
for cancel and concurrency tests). Everything else is recorded as given.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str]) -> int:
    rank = int(os.environ.get("RANK", "0"))
    record = {
        "rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "host": socket.gethostname(),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        "args": argv, "sweep_index": os.environ.get("DDPJOB_SWEEP_INDEX"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        # In a container: its own mount namespace, and the image's files (/opt/venv) at /.
        "mnt_ns": os.readlink("/proc/self/ns/mnt"), "python": sys.executable, "umask": _umask(),
    }
    # This rank's own address toward the rendezvous host (a UDP connect sends nothing).
    master = os.environ.get("MASTER_ADDR")
    if master:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((master, 9))
            record["addr"] = sock.getsockname()[0]
    if "--allreduce" in argv:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        record["allreduce_sum"] = t.item()
        dist.destroy_process_group()
    if "--sleep" in argv:
        time.sleep(float(argv[argv.index("--sleep") + 1]))
    out = os.environ["DDPJOB_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank-{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    print(f"rank {rank} of {record['world_size']} on {record['host']} via {record['master']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
