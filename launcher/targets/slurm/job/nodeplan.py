"""What a Slurm job's node runner is given, as plain data: what every run of the job shares
(``SlurmCommon``), one run (``SlurmElement``), both pickled into the job inside the runner, and what a
node makes of them: its files (``node_paths``), torchrun's argv (``node_argv``) and the variables it adds
(``node_env``). ``payload.py`` renders the same commands from here (and re-exports these names), so what
``ddpjob render`` prints is what the runner starts. The runner imports nothing client-side, this
module included: the standard library and the shared in-job modules only."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.targets.shared.launch import run_env, torchrun_argv
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.shared.vitals import VITALS_DIR_ENV


@dataclass
class SlurmCommon:
    """What every run of a job shares; pickled (inside the node runner) into the job."""

    job_id: str
    job_dir: str
    nodes: int
    procs_per_node: int
    python: str  # runs torchrun on the nodes (the container's interpreter with a runtime)
    submit_python: str  # the command submitit's sbatch script runs (apptainer exec ... python)
    workdir: str
    max_restarts: int
    master_port: int | None
    requeue: bool
    signal_delay_s: int
    max_timeouts: int
    env: dict[str, str]
    stall_timeout_s: int = 300  # spec stall.timeout: a node silent this long is reported (see shared.heartbeat)
    stall_action: str = "report"  # spec stall.action: report | fail
    max_losses: int = 0  # spec recovery.max_losses: lost nodes a run survives (0 in a plan from before recovery)
    min_nodes: int = 1  # spec recovery.min_nodes: the fewest nodes a run goes on with
    lost_after_s: int = 30  # spec recovery.lost_after: a node silent this long is lost (slurm/job/recover.py)


@dataclass
class SlurmElement:
    """One run (sweep element): its parameters, output folder, env and worker command."""

    index: int
    params: dict[str, str]
    output_dir: str
    env: dict[str, str]
    program: list[str]


def node_paths(job_dir: str, index: int, node: str | int) -> dict[str, str]:
    """Files of one node of one run (``node`` may be the runtime marker), named by ``shared.runfolder``."""
    task = RunFolder(job_dir).task(index)
    return {
        "log": task.log(node),
        "record": task.record(node),
        "error_file": task.error_file(node),
        "torchrun_log_dir": task.torchrun_logs(node),
        "watch": task.watch,  # the first node's view of every node's heartbeat and output
    }


def node_argv(common: SlurmCommon, element: SlurmElement, *, node: str, addr: str, port: str,
              nodes: int | None = None, node_rank: str | None = None) -> list[str]:
    """torchrun's argv for one node of one run. Used by render (with RUNTIME markers) and by the
    node runner inside the job (with the real values), so both show the same command. ``nodes`` and
    ``node_rank``: the run's after it lost nodes (``job/recover.py``), else the allocation's."""
    return torchrun_argv(
        element.program, launcher=[common.python, "-m", "torch.distributed.run"], max_restarts=common.max_restarts,
        nodes=nodes or common.nodes, node_rank=node_rank if node_rank is not None else node,
        procs_per_node=common.procs_per_node, addr=addr, port=port,
        log_dir=node_paths(common.job_dir, element.index, node)["torchrun_log_dir"],
    )


def node_env(common: SlurmCommon, element: SlurmElement, *, node: str) -> dict[str, str]:
    """Variables ddpjob adds for one node's processes (on top of the job's environment), sorted."""
    env = run_env(common.env, element.env, job_id=common.job_id, sweep_index=element.index,
                  output_dir=element.output_dir,
                  error_file=node_paths(common.job_dir, element.index, node)["error_file"])
    # where the trainer reports each rank's steps for the node runner's vitals (launcher.targets.shared.vitals)
    return dict(sorted({**env, VITALS_DIR_ENV: RunFolder(common.job_dir).task(element.index).vitals}.items()))
