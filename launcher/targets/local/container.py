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

import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.core.errors import Issue, TargetError

if TYPE_CHECKING:
    import subprocess

ENGINES = ("podman", "docker")
# An image reference as engines take it (name[:tag][@digest]); never an option (no leading '-').
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
# Paths that would hide the image's own system or Python if mounted over them.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/run", "/sbin",
               "/sys", "/usr", "/var")
IMAGE_PYTHON = "python"  # the image's interpreter, found on the image's PATH


@dataclass
class LocalInputs:
    """What a containerised plan needs from this machine: the submitting user's ids."""

    uid: int
    gid: int
    used_subnets: tuple[str, ...] = ()  # local.network: bridge: what its subnet must not overlap (network.py)


def read_inputs() -> LocalInputs:
    return LocalInputs(os.getuid(), os.getgid())


def container_name(job_id: str, index: int, node: int) -> str:
    return f"ddpjob-{job_id}-{index}-{node}"


def mount_problem(path: str) -> str | None:
    """Why ``path`` cannot be bind-mounted at the same path, or None."""
    if not os.path.isabs(path):
        return "is not an absolute path"
    if ":" in path or "," in path:
        return "holds ':' or ',', which the engines' --volume syntax cannot carry"
    if any(c.isspace() or not c.isprintable() for c in path):
        return "holds blanks or control characters"
    norm = os.path.normpath(path)
    if norm in ("/", *SYSTEM_DIRS, "/opt/venv") or norm.startswith(("/usr/", "/proc/", "/sys/", "/dev/", "/etc/",
                                                                      "/opt/venv/")):
        return "would hide the image's own system or Python if mounted over it"
    return None


def mounts(*paths: str) -> list[str]:
    """The folders to mount, in the given order, leaving out any that another one holds."""
    norm = list(dict.fromkeys(os.path.normpath(p) for p in paths))
    return [p for p in norm if not any(q != p and os.path.commonpath([p, q]) == q for q in norm)]


def plan_issues(spec: Any, workdir: str, run_dir: str, output_dirs: list[str]) -> list[Issue]:
    """Spec problems of a containerised plan: no usable image, a folder that cannot be mounted."""
    engine = spec.local.container
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


def user_args(engine: str, inputs: LocalInputs | None) -> list[str]:
    if inputs is None:
        return []
    if engine == "podman" and inputs.uid != 0:
        return ["--userns=keep-id"]  # rootless podman: the user's own uid inside, not a sub-uid
    return ["--user", f"{inputs.uid}:{inputs.gid}"]


def gpu_args(engine: str, gpus: int) -> list[str]:
    """Every GPU of this machine (each node's CUDA_VISIBLE_DEVICES still picks its own)."""
    if gpus <= 0:
        return []
    # docker: the NVIDIA container toolkit's --gpus; podman: the CDI device (nvidia-ctk cdi generate).
    return ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]


def run_argv(engine: str, *, name: str, image: str, workdir: str, volumes: list[str], env_names: list[str],
             user: list[str], gpus: list[str], command: list[str], network: list[str] | None = None) -> list[str]:
    """``ENGINE run ...`` for one node: the container runs ``command`` (torchrun) and is removed at its end.
    ``network``: its network options (default ``--network=host``; bridge: ``network.run_args``)."""
    argv = [engine, "run", "--rm", "--init", "--name", name, *(network or ["--network=host"]), "--ipc=host", *user,
            *gpus]
    for v in volumes:
        argv += ["--volume", f"{v}:{v}"]
    argv += ["--workdir", workdir]
    for n in env_names:
        argv += ["--env", n]
    # The engines start the command with umask 022; ddpjob's files (and its jobs') are private (077).
    return [*argv, image, "sh", "-c", 'umask 077 && exec "$@"', "sh", *command]


def shown(argv: list[str]) -> str:
    """``argv`` of ``run_argv`` as shell text, one line each for the options, mounts, env, image and
    command (joined by backslash-newlines: the same words as one line)."""
    valued = {"--name", "--network", "--ip", "--user", "--volume", "--workdir", "--env", "--gpus", "--device"}
    groups = {"--volume": "mounts", "--workdir": "mounts", "--env": "env"}
    lines: list[list[str]] = [argv[:2]]
    group, i = "options", 2
    while i < len(argv) and argv[i].startswith("--"):
        g = groups.get(argv[i], "options")
        if g != group:
            lines.append([])
            group = g
        lines[-1] += argv[i : i + 2] if argv[i] in valued else argv[i : i + 1]
        i += 2 if argv[i] in valued else 1
    lines += [argv[i : i + 1], argv[i + 1 : i + 5], argv[i + 5 :]]  # image, the umask wrapper, command
    return " \\\n    ".join(shlex.join(words) for words in lines if words)


def _engine(engine: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    import subprocess  # only when an engine is asked: render never does

    try:
        return subprocess.run([engine, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def existing(engine: str, names: list[str]) -> list[str] | None:
    """Which of ``names`` the engine still has (running or not); None if the engine cannot be asked."""
    if not names:
        return []
    proc = _engine(engine, "ps", "-a", "--format", "{{.Names}}")
    if proc is None or proc.returncode != 0:
        return None
    have = set(proc.stdout.split())
    return [n for n in names if n in have]


def remove(engine: str, names: list[str]) -> list[str]:
    """Stop and remove the containers ``names`` (missing ones are fine). Returns those left."""
    present = existing(engine, names)
    if present is None:
        present = list(names)  # cannot list: try them all
    if not present:
        return []
    # The processes were signalled already: no grace period (podman -t 0; docker rm -f kills at once).
    _engine(engine, "rm", "-f", *(["-t", "0"] if engine == "podman" else []), *present, timeout=120)
    left = existing(engine, present)
    return present if left is None else left


def remove_job_containers(engine: str, names: list[str], job_id: str) -> None:
    """``remove``, raising ``TargetError`` for containers that are left."""
    left = remove(engine, names) if engine != "none" else []
    if left:
        raise TargetError(f"could not remove the containers {', '.join(left)} of job {job_id}: "
                          f"try {engine} rm -f {' '.join(left)}")
