"""A containerised node's engine command line (``podman run`` / ``docker run``), shared by the local
target (``local.container``) and the Slurm target (``slurm.container.runtime: podman``), and the
engine calls that find and remove containers by name. Why each option of ``run_argv`` is there:
``launcher/targets/local/container.py``.

Standard library only: the local supervisor imports it.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

# An image reference as engines take it (name[:tag][@digest]); never an option (no leading '-').
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
# Paths that would hide the image's own system or Python if mounted over them.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/run", "/sbin",
               "/sys", "/usr", "/var")


@dataclass
class LocalInputs:
    """What a containerised plan needs from this machine: the submitting user's ids."""

    uid: int
    gid: int
    used_subnets: tuple[str, ...] = ()  # local.network: bridge: what its subnet must not overlap (local/network.py)


def read_inputs() -> LocalInputs:
    return LocalInputs(os.getuid(), os.getgid())


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


def user_args(engine: str, inputs: object) -> list[str]:
    if not isinstance(inputs, LocalInputs):  # no user read from this machine (a plan's inputs of another kind)
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
    ``network``: its network options (default ``--network=host``; local bridge: ``local/network.run_args``)."""
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
    valued = {"--name", "--network", "--ip", "--hostname", "--add-host", "--user", "--volume", "--workdir", "--env", "--gpus", "--device"}
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
