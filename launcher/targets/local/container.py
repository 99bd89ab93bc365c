"""Containers on the local target (``local.container: podman | docker``): each node's torchrun runs
inside the spec's image, one container per node, started by the supervisor as ``ENGINE run ...``.

What the command line gives each container, and why:
- ``--network=host --ipc=host``: the rendezvous on 127.0.0.1 and the loopback NCCL/Gloo defaults
  work unchanged across containers; shared memory (``/dev/shm``) is the host's, as NCCL expects.
  With ``local.network: bridge``, ``--network ddpjob-<job id> --ip ADDRESS`` instead: the job's own
  internal network, each node at its own address, node 0's the rendezvous (``network.py``).
- ``--init``: a small init as PID 1 passes SIGTERM on to torchrun (a bare PID 1 ignores signals it
  has no handler for) and reaps the workers.
- the working directory, the run directory and the output directory bind-mounted at the same
  paths, so every path in the plan (logs, torchrun's error files, ``DDPJOB_OUTPUT_DIR``) means the
  same inside and outside;
- ``--env NAME`` without a value for every variable of the node (and ``env_from_host``): the
  engine copies the value from its own environment, which the supervisor sets exactly as for a
  node without a container, so no value (a secret) is ever on a command line;
- ``sh -c 'umask 077 && exec "$@"'``: files the job writes are private, as without a container;
- the submitting user's uid:gid (``--user``; rootless podman: ``--userns=keep-id``), so files
  written into the run directory stay the user's and the private run directory can be written;
- ``--name ddpjob-<job id>-<task>-<node>``: ``cancel`` stops and removes the containers by name,
  besides killing the processes that carry the job's marker (the containers' too: the engine runs
  them on this machine's kernel, visible in /proc).

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.core.errors import Issue, TargetError
from launcher.targets.shared.container import (  # moved there: the Slurm target's podman runtime uses them too
    IMAGE_RE,
    SYSTEM_DIRS,
    LocalInputs,
    existing,
    gpu_args,
    mount_problem,
    mounts,
    read_inputs,
    remove,
    run_argv,
    shown,
    user_args,
)

if TYPE_CHECKING:
    from launcher.spec.model import JobSpec

__all__ = ["IMAGE_RE", "SYSTEM_DIRS", "LocalInputs", "existing", "gpu_args", "mount_problem", "mounts", "read_inputs",
           "remove", "run_argv", "shown", "user_args"]

IMAGE_PYTHON = "python"  # the image's interpreter, found on the image's PATH


def container_name(job_id: str, index: int, node: int) -> str:
    return f"ddpjob-{job_id}-{index}-{node}"


def plan_issues(spec: JobSpec, workdir: str, run_dir: str, output_dirs: list[str]) -> list[Issue]:
    """Spec problems of a containerised plan: no usable image, a folder that cannot be mounted."""
    from launcher.targets.local.options import LocalOptions  # here: pydantic is not where the supervisor runs

    engine = spec.section(LocalOptions).container
    issues = []
    if spec.image is None:
        issues.append(Issue(("local", "container"), f"local.container: {engine} needs an image",
                            hint="set image: to the training image (docker/build.sh builds one)"))
    elif not IMAGE_RE.match(spec.image):
        issues.append(Issue(("image",), "must be an image reference: letters, digits and . _ / : @ + -, "
                            "starting with a letter or digit"))
    # Blame the spec's field when the folder comes from it, else the option that asks for containers.
    paths = [(("workdir",) if spec.workdir else ("local", "container"), "the working directory", workdir),
             (("local", "container"), "the run directory", run_dir),
             *((("output_dir",) if spec.output_dir else ("local", "container"), "the output directory", d)
               for d in output_dirs)]
    for field, what, path in paths:
        why = mount_problem(path)
        if why is not None:
            issues.append(Issue(field, f"{what} {path} {why}", hint="containers mount it at the same path; "
                                "submit from (or set workdir: to) a project folder, and output_dir: elsewhere"))
    return list({(i.path, i.message): i for i in issues}.values())


def remove_job_containers(engine: str, names: list[str], job_id: str) -> None:
    """``remove``, raising ``TargetError`` for containers that are left."""
    left = remove(engine, names) if engine != "none" else []
    if left:
        raise TargetError(f"could not remove the containers {', '.join(left)} of job {job_id}: "
                          f"try {engine} rm -f {' '.join(left)}")
