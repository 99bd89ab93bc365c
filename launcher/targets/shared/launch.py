"""The per-node launch, shared by every target: torchrun's argv and the run's environment.

Two torchrun behaviours shape this:
- torchrun runs scripts and ``-m`` modules with its own interpreter, so a leading ``python`` is
  dropped; any other program runs as it is with ``--no-python``.
- torchrun passes every worker argument through ``string.Template.safe_substitute`` (its
  ``${local_rank}`` macro): ``$$`` would reach the program as ``$`` and ``$local_rank`` as a
  number. Doubling every ``$`` undoes that exactly, so user arguments arrive as written. With
  ``--no-python`` the program name itself is not substituted, so it is left alone.
"""

from __future__ import annotations

import os

_PYTHONS = ("python", "python3")


def torchrun_program(command: list[str], python: str) -> list[str]:
    """``script args``, ``-m module args`` or ``--no-python prog args``, before escaping."""
    first = os.path.basename(command[0])
    is_python = first in _PYTHONS or first.startswith("python3.")
    if is_python and len(command) > 1 and (command[1] == "-m" or not command[1].startswith("-")):
        return command[1:]
    if is_python:
        return ["--no-python", python, *command[1:]]
    return ["--no-python", *command]


def torchrun_escape(program: list[str]) -> list[str]:
    """Protect the program's arguments from torchrun's ``$`` macros (see the module docstring)."""
    keep = {1} if program and program[0] == "--no-python" else set()
    return [a if i in keep else a.replace("$", "$$") for i, a in enumerate(program)]


def worker_command(command: list[str], python: str) -> list[str]:
    """Everything after torchrun's own options, so that the workers receive ``command`` literally."""
    return torchrun_escape(torchrun_program(command, python))


def torchrun_argv(
    program: list[str],
    *,
    launcher: list[str],
    max_restarts: int,
    nodes: int | None = None,
    node_rank: str | None = None,
    procs_per_node: int | None = None,
    addr: str | None = None,
    port: str | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """torchrun's whole argv for one node: the one per-node launch every target uses.

    Args:
        program: ``worker_command(...)`` (already escaped).
        launcher: how torchrun is started, e.g. ``[python, "-m", "torch.distributed.run"]`` or
            ``["torchrun"]``.
        nodes, node_rank, procs_per_node, addr, port: the static rendezvous. Left out (None)
            where the scheduler injects them instead (Kubeflow's PET_* variables).
        log_dir: ``--log-dir``, where torchrun keeps each worker's stdout/stderr (root causes).
    """
    argv = list(launcher)
    for flag, value in (("--nnodes", nodes), ("--node-rank", node_rank), ("--nproc-per-node", procs_per_node),
                        ("--master-addr", addr), ("--master-port", port)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--max-restarts", str(max_restarts), "--tee", "3"]
    if log_dir is not None:
        argv += ["--log-dir", log_dir]
    return [*argv, *program]


def run_env(
    base: dict[str, str],
    element_env: dict[str, str],
    *,
    job_id: str,
    sweep_index: int,
    output_dir: str,
    error_file: str | None = None,
) -> dict[str, str]:
    """The variables of one run's processes on one node, sorted: the node's ``base`` (NCCL,
    threads, the spec's env), the run's own env (sweep placeholders filled), then what ddpjob sets
    for every run (``DDPJOB_*``, the metrics file that ``launcher.core.progress`` reads, and torchrun's
    error file where the target reads it back). ``launcher.core.progress`` is imported here, not at module top:
    Slurm's node runner builds its nodes' env with this inside the job, where a module imports only the
    standard library at its top (tests/foundation/test_found_wing.py)."""
    from launcher.core.progress import metrics_path

    env = {**base, **element_env, "DDPJOB_JOB_ID": job_id, "DDPJOB_SWEEP_INDEX": str(sweep_index),
           "DDPJOB_OUTPUT_DIR": output_dir, "DDPJOB_METRICS_FILE": metrics_path(output_dir)}
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    return dict(sorted(env.items()))
