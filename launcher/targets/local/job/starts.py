"""Starting a run's nodes, for the supervisor: each through the node wrapper, in the job's cgroup where
it has one, with the secret env values that came in the supervisor's environment (``secretenv``)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from launcher.targets.local.job import node as node_wrapper
from launcher.targets.local.job.recover import RESTART_ENV
from launcher.targets.shared.runfolder import exit_file

if TYPE_CHECKING:
    from launcher.targets.local.payload import LocalNode


class Starts:
    """``cgroup``: the job's cgroup (``cgroups.make_job``), or None and ``cgroup_unavailable`` saying
    why; ``secrets``: the secret env values by ``"run/node"``."""

    def __init__(self, cgroup: str | None = None, cgroup_unavailable: str = "",
                 secrets: dict[str, dict[str, str]] | None = None) -> None:
        self.cgroup, self.cgroup_unavailable = cgroup, cgroup_unavailable
        self.secrets = secrets or {}

    def nodes(self, nodes: list[LocalNode], output_dir: str, index: int,
              restart: int = 0) -> tuple[list[tuple[LocalNode, node_wrapper.Proc]], str | None]:
        """Start run ``index``'s nodes, each through the node wrapper (in a cgroup of its own where the
        job has one); the ones started, and why the next one could not be (None when all were).
        ``nodes`` are the plan's nodes; ``restart``: the how-manieth start after a lost
        node this is (``DDPJOB_RESTART_COUNT``; 0: the first start, the variable not set)."""
        from launcher.targets.local.job import cgroups

        again = {RESTART_ENV: str(restart)} if restart else {}
        running: list[tuple[LocalNode, node_wrapper.Proc]] = []
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:  # a full disk, a file in the way: the run fails, the supervisor goes on
            return running, f"cannot make the output directory {output_dir}: {e.strerror or e}"
        for node in nodes:
            try:
                os.makedirs(os.path.dirname(node.log), exist_ok=True)
                # Through the node wrapper: it records how the agent ended even if we are killed.
                p = node_wrapper.start(sys.executable, exit_file(node.log), node.argv,
                                       env={**os.environ, **node.env, **self.secrets.get(f"{index}/{node.node}", {}),
                                            **again},
                                       cwd=node.cwd, log=node.log,
                                       cgroup=cgroups.node_dir(self.cgroup, index, node.node) if self.cgroup else None)
            except OSError as e:
                return running, f"node {node.node}: cannot start {node.argv[0]}: {e}"
            running.append((node, p))
        return running, None
