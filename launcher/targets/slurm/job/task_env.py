"""``python -m launcher.targets.slurm.job.task_env ARGS...``: how each task of an oci job starts inside
its container. Slurm 22.05 builds an OCI container's environment from the step's, without the
per-task variables (``SLURM_NODEID``, ``SLURM_PROCID``, ``SLURM_LOCALID``): what it has are the
batch script's (all 0), which srun passed on, so submitit (which picks its result file and the task
that requeues by ``SLURM_PROCID``) and the node runner would all take themselves for task 0. This
sets them from the node's hostname, which the container shares with
the node (no UTS namespace), and its place in the step's node list (ddpjob runs one task per node),
then execs ``python ARGS`` (submitit's ``-u -m submitit.core._submit FOLDER``).
"""

from __future__ import annotations

import os
import socket
import sys

from launcher.targets.slurm.job.nodelist import expand_nodelist


def task_variables(env: dict[str, str], hostname: str) -> dict[str, str]:
    """The per-task variables of the task on ``hostname``. Raises ``LookupError`` when ``hostname``
    is not one of the step's nodes."""
    out = {}
    for var, nodelist in (("SLURM_PROCID", "SLURM_STEP_NODELIST"), ("SLURM_NODEID", "SLURM_JOB_NODELIST")):
        hosts = expand_nodelist(env.get(nodelist, ""))
        names = [h.split(".")[0] for h in hosts]
        short = hostname.split(".")[0]
        if short not in names:
            raise LookupError(f"this node's hostname {hostname} is not in {nodelist}={env.get(nodelist, '')}: Slurm "
                              "does not set SLURM_NODEID in OCI containers, and ddpjob finds it by hostname, so Slurm's "
                              "node names must be the hosts' names")
        out[var] = str(names.index(short))
    out["SLURM_LOCALID"] = "0"
    return out


def main(argv: list[str]) -> int:  # returns only on an error: execv replaces it
    try:
        os.environ.update(task_variables(dict(os.environ), socket.gethostname()))
    except LookupError as e:
        print(f"ddpjob: {e}", file=sys.stderr, flush=True)
        return 1
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
