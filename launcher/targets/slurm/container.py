"""Containers on the Slurm target (``slurm.container.runtime``): how each node's Slurm task starts.

- ``pyxis``: ``srun --container-image`` (enroot/pyxis); ``apptainer``: ``apptainer exec``. Rendered
  and documented; not run here (no pyxis or apptainer on this machine).
- ``oci``: Slurm's own containers, ``srun --container=<bundle>``: slurmstepd runs each task through
  the runtime that oci.conf names (runc). Slurm 22.05 copies the bundle's config.json into its spool,
  puts the task's argv into it, appends the task's environment to the image's, and takes
  ``<bundle>/rootfs`` as the root whatever config.json says (and runc refuses a symlink there). So
  the mounts live in the bundle, and there is one bundle per image and set of mounts:
  ``<folder>/oci/<image id>/rootfs`` holds the image's files (``podman export``, once per image) and
  ``<folder>/oci/<image id>-<config digest>/`` this config.json with ``rootfs/`` hard-linked from
  there (no copy). The submitting shell's PATH, appended by Slurm, would win over the image's and
  find the image's system Python, so the task starts as ``env PATH=<the image's PATH> python3``,
  through ``task_env`` (Slurm leaves SLURM_NODEID, SLURM_PROCID out of the container's environment).
  config.json asks for a mount namespace only: network, IPC, PIDs and hostname stay the node's (as
  podman's ``--network=host --ipc=host``), so every process is one of the step's and Slurm's
  signals (USR2, cancel) reach them as without a container.
- ``podman``: ``podman run`` of the image on each node, with the local target's engine command line
  (``targets/shared/container.py``). The container's processes are children of podman's conmon,
  not of the Slurm task, so Slurm's kill does not reach them: a task epilog (``srun
  --task-epilog``, which slurmstepd runs after each task ends, however it ended) removes the node's
  container by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.core.errors import Issue
from launcher.targets.shared.container import LocalInputs, gpu_args, mount_problem, mounts, run_argv, user_args
from launcher.targets.shared.runfolder import RunFolder, TaskFolder
from launcher.targets.slurm.payload import RUNTIME, OciBundle, shell_word

if TYPE_CHECKING:
    from launcher.spec.load import LoadedSpec
    from launcher.targets.base import PlanContext

UNKNOWN_ID = "<image id>"
UNKNOWN_PATH = "<the image's PATH>"
# Podman: what the node's task hands on to the container by name (values never on a command line):
# Slurm's and submitit's variables (submitit reads the task's SLURM_* inside), ddpjob's rendezvous
# port, the GPUs Slurm gave the task, and the spec's env_from_host.
PODMAN_ENV = ["SLURM_*", "SUBMITIT_*", "DDPJOB_*", "CUDA_VISIBLE_DEVICES"]
_CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]  # runc spec's defaults


# Each task of an oci job starts with this check (<job dir>/oci-check.sh): the bundle's config.json
# sets OCI_MARKER; without it Slurm ran the task on the node itself, and it stops before Python.
OCI_MARKER = "DDPJOB_OCI_IMAGE"
# The script's paths in shell words, named by shared.runfolder: the run's folder beside the script, the node's files in it.
_CHECK_TASK = RunFolder('$(dirname "$0")').task("${SLURM_ARRAY_TASK_ID:-0}")
_CHECK_LOG, _CHECK_RECORD = TaskFolder("$d").log("$n"), TaskFolder("$d").record("$n")
OCI_CHECK = f"""#!/bin/sh
# Written by ddpjob: each task of this job starts here. In the OCI bundle, its config.json sets
# {OCI_MARKER}; without it Slurm ran the task on the node itself (a Slurm without container support
# ignores srun --container), so the task stops now and says why (its node's record and log).
[ -n "${{{OCI_MARKER}:-}}" ] && exec "$@"
n=${{SLURM_NODEID:-0}}; h=$(hostname)
m="node $n ($h): slurm.container.runtime oci is not in force: Slurm ran the task on the node itself, not in \\
the OCI bundle; this cluster has no container support for srun --container (Slurm needs an oci.conf beside \\
slurm.conf on every node, naming the OCI runtime, e.g. runc)"
d={_CHECK_TASK.path}
mkdir -p "$d"
echo "[ddpjob] $m" >> "{_CHECK_LOG}"
printf '{{"node": %s, "host": "%s", "state": "exited", "exit_code": 2, "error": "%s"}}\\n' "$n" "$h" "$m" > "{_CHECK_RECORD}"
echo "ddpjob: $m" >&2
exit 2
"""


@dataclass
class ContainerInputs:
    """What an oci or podman plan reads before planning: the submitting user's ids, and for oci the
    image's id and environment (``podman image inspect``) or the named bundle's config.json."""

    user: LocalInputs
    image_id: str | None = None
    env: list[str] = field(default_factory=list)
    bundle_mounts: list[str] = field(default_factory=list)  # a named bundle's mount destinations
    problem: str | None = None  # why the image or bundle could not be read (render shows placeholders)


@dataclass(frozen=True)
class Launch:
    """How each node starts: the interpreter on the node, what sbatch runs, srun's extra options, and
    what submit prepares first (an OCI bundle; files such as podman's task epilog)."""

    python: str
    submit_python: str
    srun_args: list[str]
    oci: OciBundle | None = None
    files: dict[str, str] = field(default_factory=dict)


def read_inputs(loaded: LoadedSpec, *, online: bool) -> ContainerInputs | None:
    """The inputs of an oci or podman plan; None for the other runtimes. Submitting (``online``), an
    image or bundle that cannot be read is the spec's error; rendering, it shows as placeholders."""
    spec = loaded.spec
    from launcher.targets.slurm.options import SlurmOptions  # here, where a spec is planned: pydantic only then

    c = spec.section(SlurmOptions).container
    if c.runtime not in ("oci", "podman"):
        return None
    facts = ContainerInputs(LocalInputs(os.getuid(), os.getgid()))
    image = c.image or spec.image
    where: tuple[str | int, ...] = ("slurm", "container", "image") if c.image else ("image",)
    if c.runtime == "oci" and c.bundle:
        where = ("slurm", "container", "bundle")
        try:
            with open(os.path.join(c.bundle, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
            facts.env = [e for e in config.get("process", {}).get("env", []) if isinstance(e, str)]
            facts.bundle_mounts = [m.get("destination", "") for m in config.get("mounts", []) if isinstance(m, dict)]
            facts.image_id = "bundle"
        except (OSError, ValueError, AttributeError) as e:
            facts.problem = f"cannot read the bundle's config.json: {e}"
    elif c.runtime == "oci" and image:
        from launcher.targets.shared.container import _engine

        proc = _engine("podman", "image", "inspect", "--format", "{{.Id}}\t{{json .Config.Env}}", image)
        if proc is None:
            facts.problem = "podman is not installed here (it makes the OCI bundle from the image)"
        elif proc.returncode != 0:
            facts.problem = f"podman has no image {image} here: {proc.stderr.strip().splitlines()[-1:]}"
        else:
            image_id, _, env = proc.stdout.strip().partition("\t")
            facts.image_id, facts.env = image_id, [e for e in json.loads(env or "null") or [] if isinstance(e, str)]
    if facts.problem and online:
        raise loaded.error([Issue(where, facts.problem, hint="build the image (docker/build.sh) or pull it with "
                                  "podman on this machine, or name a bundle: slurm.container.bundle")])
    return facts


def launch(loaded: LoadedSpec, ctx: PlanContext, *, folder: str, job_dir: str, workdir: str,
           output_dirs: list[str], gpus: int, array: bool) -> Launch:
    """The interpreter each node runs and how: on the node itself, or in a container."""
    from launcher.targets.slurm.options import _IMAGE_RE

    spec = loaded.spec
    from launcher.targets.slurm.options import SlurmOptions  # here, where a spec is planned: pydantic only then

    c = spec.section(SlurmOptions).container
    image = c.image or spec.image
    # --kill-on-bad-exit: when torchrun on one node fails, the run has failed; without it the
    # other nodes' agents wait out torchrun's exit barrier (5 minutes) before the job ends.
    srun_args = ["--kill-on-bad-exit=1"]
    if c.runtime == "none":
        return Launch(ctx.python, shlex.quote(ctx.python), srun_args)
    if c.bundle and c.runtime != "oci":
        raise loaded.error([Issue(("slurm", "container", "bundle"), f"a bundle is for runtime oci, not {c.runtime}",
                                  hint="remove slurm.container.bundle or set slurm.container.runtime: oci")])
    if image is None and not c.bundle:
        raise loaded.error([Issue(("slurm", "container", "image"), f"container runtime {c.runtime} needs an image"
                                  + (" or a bundle" if c.runtime == "oci" else ""),
                                  hint="set image: (top level) or slurm.container.image"
                                  + (", or slurm.container.bundle" if c.runtime == "oci" else ""))])
    if image is not None and not _IMAGE_RE.match(image):
        raise loaded.error([Issue(("image",), "must be an image reference or path without blanks or quotes")])
    if c.runtime == "pyxis":
        srun_args += [f"--container-image={image}", f"--container-mounts={','.join(_mounts([folder, workdir], c.mounts))}",
                      f"--container-workdir={workdir}"]
        return Launch(c.python, shlex.quote(c.python), srun_args)
    if c.runtime == "apptainer":
        binds: list[str] = []
        for m in _mounts([folder, workdir], c.mounts):
            binds += ["--bind", m]
        return Launch(c.python, shlex.join(["apptainer", "exec", "--nv", *binds, "--pwd", workdir, str(image), c.python]),
                      srun_args)
    volumes = mounts(folder, workdir, *output_dirs)
    _check_mounts(loaded, volumes, workdir, folder)
    inputs: ContainerInputs | None = ctx.inputs if isinstance(ctx.inputs, ContainerInputs) else None
    if c.runtime == "podman":
        return _podman(loaded, ctx, str(image), volumes, inputs, job_dir=job_dir, workdir=workdir, gpus=gpus,
                       array=array, srun_args=srun_args)
    return _oci(loaded, folder, image, volumes, inputs, workdir=workdir, job_dir=job_dir, srun_args=srun_args)


def _podman(loaded: LoadedSpec, ctx: PlanContext, image: str, volumes: list[str], inputs: ContainerInputs | None, *,
            job_dir: str, workdir: str, gpus: int, array: bool, srun_args: list[str]) -> Launch:
    spec = loaded.spec
    from launcher.targets.slurm.options import SlurmOptions  # here, where a spec is planned: pydantic only then

    c = spec.section(SlurmOptions).container
    # Each task names its container after its run and node, known only inside the task: the
    # sbatch line starts sh, which expands them and execs podman.
    name = f"ddpjob-{ctx.job_id}-" + (RUNTIME["task"] if array else "0") + "-" + RUNTIME["node"]
    argv = run_argv("podman", name=name, image=image, workdir=workdir, volumes=volumes,
                    env_names=[*PODMAN_ENV, *spec.env_from_host], user=user_args("podman", inputs.user if inputs else None),
                    gpus=gpu_args("podman", gpus), command=[])
    at = argv.index("--workdir")
    for m in c.mounts:  # HOST[:CONTAINER[:ro|rw]], as the spec gives them
        argv[at:at] = ["--volume", m if ":" in m else f"{m}:{m}"]
        at += 2
    script = "exec " + " ".join(shell_word(a) for a in argv) + ' "$@"'
    epilog = RunFolder(job_dir).podman_epilog
    shown_name = shell_word(name).replace('"$SLURM_ARRAY_TASK_ID"', '"${SLURM_ARRAY_TASK_ID:-0}"')
    text = ("#!/bin/sh\n# Written by ddpjob: slurmstepd runs this after each task of the job ends, however it ended "
            "(srun --task-epilog),\n# and it removes the node's container with anything still running in it.\n"
            f"exec podman rm -f -t 0 --ignore {shown_name} >/dev/null\n")
    return Launch(c.python, shlex.join(["sh", "-c", script, "sh"]) + " " + shlex.quote(c.python),
                  [*srun_args, f"--task-epilog={epilog}"], files={epilog: text})


def _oci(loaded: LoadedSpec, folder: str, image: str | None, volumes: list[str], inputs: ContainerInputs | None, *,
         workdir: str, job_dir: str, srun_args: list[str]) -> Launch:
    from launcher.targets.slurm.options import SlurmOptions  # here, where a spec is planned: pydantic only then

    c = loaded.spec.section(SlurmOptions).container
    env = inputs.env if inputs and not inputs.problem else []
    path = next((e.split("=", 1)[1] for e in env if e.startswith("PATH=")), UNKNOWN_PATH if not env else "")
    # Slurm leaves the per-task variables out of the container: task_env fills them in first.
    python = [*(["env", f"PATH={path}"] if path else []), c.python, "-m", "launcher.targets.slurm.job.task_env"]
    if c.bundle:
        missing = [p for p in (folder, workdir) if inputs and not inputs.problem
                   and not any(os.path.commonpath([p, m]) == m for m in inputs.bundle_mounts if m.startswith("/"))]
        if missing:
            raise loaded.error([Issue(("slurm", "container", "bundle"), f"the bundle's config.json does not mount "
                                      f"{', '.join(missing)}", hint="add a bind mount at the same path to its "
                                      "mounts, or leave bundle unset so ddpjob makes one from the image")])
        bundle = OciBundle(c.bundle)
    else:
        uid, gid = (inputs.user.uid, inputs.user.gid) if inputs else (os.getuid(), os.getgid())
        image_id = (inputs.image_id if inputs and inputs.image_id and not inputs.problem else UNKNOWN_ID)
        # The marker that the task really runs in the bundle (OCI_CHECK): Slurm without container
        # support ignores srun --container and runs the task on the host.
        text = json.dumps(oci_config(uid=uid, gid=gid, env=[*env, f"{OCI_MARKER}={image_id}"], volumes=volumes,
                                     extra=c.mounts, workdir=workdir), indent=1) + "\n"
        short = image_id.split(":")[-1][:12]
        base = f"{folder}/oci/{short}"
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        bundle = OciBundle(f"{base}-{digest}", image, image_id, base, text)
    if c.bundle:
        return Launch(c.python, shlex.join(python), [*srun_args, f"--container={bundle.path}"], oci=bundle)
    check = RunFolder(job_dir).oci_check
    return Launch(c.python, shlex.join(["sh", check, *python]), [*srun_args, f"--container={bundle.path}"], oci=bundle,
                  files={check: OCI_CHECK})


def oci_config(*, uid: int, gid: int, env: list[str], volumes: list[str], extra: list[str], workdir: str) -> dict[str, object]:
    """config.json of a bundle: the image's root read-only, a mount namespace only, the Slurm folder,
    working and output directories (and ``extra``) at the same paths, the user's ids and umask 077.
    A user other than root gets a user namespace mapping its own ids (runc runs rootless for it)."""
    def bind(src: str, dst: str, *opts: str) -> dict[str, object]:
        return {"destination": dst, "type": "bind", "source": src, "options": ["rbind", *opts]}

    mnts = [bind("/proc", "/proc", "nosuid", "noexec", "nodev"),
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            bind("/dev/shm", "/dev/shm", "nosuid", "nodev"),  # the node's, as podman's --ipc=host (NCCL)
            bind("/sys", "/sys", "nosuid", "noexec", "nodev", "ro"),
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            bind("/etc/hosts", "/etc/hosts", "ro"), bind("/etc/resolv.conf", "/etc/resolv.conf", "ro")]
    mnts += [bind(v, v, "rw") for v in volumes]
    for m in extra:
        host, _, rest = m.partition(":")
        dst, _, mode = rest.partition(":")
        mnts.append(bind(host, dst or host, mode or "rw"))
    namespaces = [{"type": "mount"}]
    linux: dict[str, object] = {"namespaces": namespaces}
    if uid != 0:
        namespaces.append({"type": "user"})
        linux["uidMappings"] = [{"containerID": uid, "hostID": uid, "size": 1}]
        linux["gidMappings"] = [{"containerID": gid, "hostID": gid, "size": 1}]
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": uid, "gid": gid, "umask": 0o77}, "args": ["true"],
                    "env": env, "cwd": workdir, "noNewPrivileges": True,
                    "capabilities": dict.fromkeys(("bounding", "effective", "permitted", "ambient"), _CAPS)},
        "root": {"path": "rootfs", "readonly": True},
        "mounts": mnts,
        "linux": linux,
    }


def _check_mounts(loaded: LoadedSpec, volumes: list[str], workdir: str, folder: str) -> None:
    spec = loaded.spec
    issues = []
    for path in volumes:
        why = mount_problem(path)
        if why is not None:
            field_ = ("workdir",) if path == workdir and spec.workdir else (
                ("slurm", "folder") if path == folder else ("output_dir",) if spec.output_dir else ("slurm", "container"))
            issues.append(Issue(field_, f"{path} {why}", hint="containers mount it at the same path; use a project "
                                "folder for workdir:, and slurm.folder/output_dir elsewhere"))
    if issues:
        raise loaded.error(issues)


def _mounts(paths: list[str], extra: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if p not in out:
            out.append(p)
    out += [m for m in extra if m not in out]
    return out


def prepare_bundle(b: OciBundle) -> None:
    """Make ``b.path`` (at submit; nothing to do for a named bundle or one made before): the image's
    files exported once under ``b.base``, then config.json beside a hard-linked copy of them.
    Raises ``RuntimeError`` saying what failed."""
    import shutil
    import subprocess

    if b.image is None or os.path.isfile(os.path.join(b.path, "config.json")):
        return
    rootfs = os.path.join(b.base, "rootfs")
    if not os.path.isdir(rootfs):
        tmp = f"{b.base}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(f"{tmp}/rootfs")
        made = subprocess.run(["podman", "create", "--pull=never", b.image, "true"], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, check=False, timeout=120)
        if made.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"podman create {b.image} failed: {made.stderr.strip()}")
        cid = made.stdout.strip()
        try:
            with subprocess.Popen(["podman", "export", cid], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as export:
                untar = subprocess.run(["tar", "-C", f"{tmp}/rootfs", "-x"], stdin=export.stdout, capture_output=True,
                                       text=True, check=False, timeout=1800)
            if export.returncode != 0 or untar.returncode != 0:
                raise RuntimeError(f"podman export {b.image} | tar -x failed: {untar.stderr.strip()[-500:]}")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            subprocess.run(["podman", "rm", "-f", cid], capture_output=True, check=False, timeout=120)
        _rename_or_drop(tmp, b.base)
    tmp = f"{b.path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # Hard links: every bundle of this image shares the exported files (root is read-only in config.json).
    linked = subprocess.run(["cp", "-al", rootfs, f"{tmp}/rootfs"], capture_output=True, text=True, check=False,
                            timeout=600)
    if linked.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"cp -al {rootfs} failed: {linked.stderr.strip()[-500:]}")
    with open(f"{tmp}/config.json", "w", encoding="utf-8") as f:
        f.write(b.config)
    _rename_or_drop(tmp, b.path)


def _rename_or_drop(tmp: str, final: str) -> None:
    """Move ``tmp`` into place, or drop it when another submit made ``final`` first."""
    import shutil

    try:
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
