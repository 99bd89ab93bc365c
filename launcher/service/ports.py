"""``python -m launcher.service.ports HOME JOB_ID``: a new rendezvous port for a running job.

A job whose port another program took before its rendezvous (the local supervisor sees torchrun's
EADDRINUSE) calls this command, which the service hands it in ``PlanContext.port_command``: the
port is chosen by the job's target among those no live job of the registry at ``HOME`` holds, and
recorded for the job in the same transaction, as at submit. It prints the port. The job's own
processes never open the registry.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.core.errors import DdpjobError


def reassign(home: str, job_id: str) -> int:
    """Choose, record and return a new port for ``job_id``."""
    from launcher.service.registry import Registry
    from launcher.targets.lookup import get_target

    registry = Registry(Path(home))
    target = get_target(registry.get(job_id).target)
    return registry.reassign_port(job_id, target.pick_port)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m launcher.service.ports HOME JOB_ID", file=sys.stderr)
        return 2
    try:
        print(reassign(argv[0], argv[1]))
    except (DdpjobError, OSError) as e:  # the caller reports it and ends the run as failed
        print(f"cannot choose a new port: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
