"""The ``slurm:`` section of a job spec (options used only by the Slurm target).

Everything here ends up in an sbatch script, so every string is checked for what Slurm accepts
and for anything that could change the script's meaning (line breaks, control characters,
``%`` patterns in paths). The one deliberate exception is ``setup``: those lines *are* shell.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from launcher.core.plugins import TargetPlugin
from launcher.core.quantity import QuantityError, parse_memory, shorten

# sbatch --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes" and "days-hours:minutes:seconds".
_TIME_RES = (
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)
_NAME_LIST_RE = re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$")
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.,:&|*()\[\]!-]+$")
_OPTION_NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
# Paths go into #SBATCH --output and srun arguments: no '%' (Slurm filename patterns), no blanks,
# quotes or shell metacharacters, so the script never needs to rely on quoting for them.
_PATH_RE = re.compile(r"^(~/|/)?[A-Za-z0-9_./+@=,-]*$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9_./:@#+=-]+$")
_MOUNT_RE = re.compile(r"^/[A-Za-z0-9_./+@=-]*(:/[A-Za-z0-9_./+@=-]*)?(:(ro|rw))?$")

# Options the target computes itself (or that have their own field); setting them through
# ``sbatch:`` would silently break the job, so the spec refuses them.
RESERVED_SBATCH = frozenset({
    "array", "nodes", "ntasks", "ntasks-per-node", "output", "error", "open-mode", "signal", "job-name",
    "requeue", "no-requeue", "time", "partition", "account", "qos", "gpus-per-node", "cpus-per-task",
    "mem", "constraint", "exclusive", "wrap", "chdir", "export", "parsable",
})
DEFAULT_FOLDER = "~/.ddpjob/slurm"


def _no_control(value: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must not contain line breaks or other control characters")
    return value


# Slurm keeps a time limit as 32-bit minutes, the top two values meaning "unset" and "infinite".
MAX_TIME_MINUTES = 2**32 - 3


def time_to_minutes(value: str) -> int:
    """A Slurm time limit in whole minutes (rounded up), e.g. ``"1-02:00:00"`` -> 1560.

    Raises:
        ValueError: not one of Slurm's forms, or longer than Slurm can hold (``MAX_TIME_MINUTES``).
    """
    for pattern, units in _TIME_RES:
        m = pattern.match(value)
        if m:
            if any(len(num) > 12 for num in m.groups()):
                raise ValueError(value)  # more minutes than Slurm holds, whatever the unit; int() not tried
            seconds = 0
            for unit, num in zip(units, m.groups()):
                seconds += int(num) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[unit]
            minutes = max(1, -(-seconds // 60))  # integer ceiling: seconds / 60 overflows a float
            if minutes > MAX_TIME_MINUTES:
                raise ValueError(value)
            return minutes
    raise ValueError(value)


class ContainerOptions(BaseModel):
    """Run each node's ddpjob entry (and so torchrun and the training processes) inside a container."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    runtime: Literal["none", "pyxis", "apptainer", "oci", "podman"] = Field(
        "none",
        description="none: run on the node's own Python; pyxis: `srun --container-image=<image>` (NVIDIA "
        "enroot/pyxis); apptainer: `apptainer exec --nv <image> python3 ...`; oci: Slurm's own containers, "
        "`srun --container=<OCI bundle>` (oci.conf with runc), the bundle made from the image under "
        "<folder>/oci/ or `bundle`; podman: `podman run` of the image on each node (host network and IPC, the "
        "Slurm folder and working directory mounted, your uid, variables passed by name). The image must contain "
        "ddpjob with the `slurm` extra at the same submitit version as the submitting machine, because submitit "
        "unpickles its launcher inside it.",
    )
    image: str | None = Field(
        None,
        description="Image to run (pyxis: e.g. 'nvcr.io#nvidia/pytorch:24.01-py3'; apptainer: a .sif path or "
        "'docker://...'; oci, podman: an image podman has on the submitting machine, e.g. one docker/build.sh built). "
        "Default: the spec's top-level image.",
    )
    bundle: str | None = Field(
        None,
        description="oci only: an OCI bundle to run as it is (a folder holding config.json and rootfs/, readable on "
        "every node) instead of one ddpjob makes from the image. Its config.json must mount the Slurm folder and "
        "the working directory at the same paths.",
    )
    mounts: list[str] = Field(
        default=[],
        description="Extra bind mounts as 'HOST[:CONTAINER[:ro|rw]]' (absolute paths). The Slurm folder and "
        "the working directory are mounted automatically.",
    )
    python: str = Field(
        "python3", description="The Python interpreter inside the image (runs submitit and torchrun)."
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not _IMAGE_RE.match(v):
            raise ValueError("must be an image reference or path (letters, digits and _ . / : @ # + = -)")
        return v

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or not _PATH_RE.match(v)):
            raise ValueError("must be an absolute path of letters, digits and _ . / + @ = , - (no blanks or quotes)")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for mount in v:
            if not _MOUNT_RE.match(mount):
                raise ValueError(f"{mount!r} must be HOST[:CONTAINER[:ro|rw]] with absolute paths and no blanks or commas")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_./+-]+", v):
            raise ValueError("must be a program name or absolute path, e.g. python3 or /opt/conda/bin/python")
        return v


SbatchValue = StrictBool | StrictInt | str


class SlurmOptions(BaseModel):
    """Options for ``--target slurm``. Validated as part of every spec; used only by that target."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    partition: str | None = Field(None, description="Slurm partition(s), comma-separated (sbatch --partition).")
    account: str | None = Field(None, description="Account to charge (sbatch --account).")
    qos: str | None = Field(None, description="Quality of service (sbatch --qos).")
    time: str | StrictInt = Field(
        "1:00:00",
        description="Time limit of each run, in a Slurm format: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS. Quote it in YAML ('2:00:00'). Written as whole minutes (submitit needs the limit to tell "
        "a timeout from a preemption).",
    )
    gpus_per_node: StrictInt | None = Field(
        None, ge=0, description="GPUs per node (sbatch --gpus-per-node). Default: resources.gpus; 0 requests none."
    )
    cpus_per_task: StrictInt | None = Field(
        None, ge=1,
        description="CPUs of the one task on each node (sbatch --cpus-per-task), shared by its processes. "
        "Default: resources.cpus.",
    )
    memory: str | None = Field(
        None, description="Memory per node in sbatch --mem's spelling: '16G' and '16Gi' both mean 16 GiB, a bare "
        "number is megabytes. Default: resources.memory."
    )
    constraint: str | None = Field(None, description="Node features (sbatch --constraint), e.g. 'a100|h100'.")
    exclusive: bool = Field(False, description="Whole nodes for this job only (sbatch --exclusive).")
    array_parallelism: StrictInt | None = Field(
        None, ge=1, description="For sweeps: how many runs of the job array may run at once (--array=0-K%N). "
        "Default: all of them.",
    )
    folder: str = Field(
        DEFAULT_FOLDER,
        description="Where submitit keeps sbatch scripts, pickles and logs, and where node logs and (by default) "
        "outputs go: <folder>/<job id>/. Must be on a filesystem every node shares. '~' is your home; a "
        "relative path is taken from the submit directory. Default: ~/.ddpjob/slurm, or $DDPJOB_HOME/slurm "
        "where DDPJOB_HOME is set.",
    )
    setup: list[str] = Field(
        default=[],
        description="Shell lines run by the sbatch script before the job starts, e.g. 'module load cuda/12.4'. "
        "These are shell code by design; they run on the first node only.",
    )
    sbatch: dict[str, SbatchValue] = Field(
        default={},
        description="More sbatch options as name: value, e.g. {mail-type: END, reservation: big}; true means a "
        "flag without value. Names are lowercase sbatch long options without '--'; options ddpjob sets itself "
        "(nodes, array, time, ...) have their own fields and are refused here.",
    )
    container: ContainerOptions = Field(default_factory=ContainerOptions, description="Container runtime for the job.")
    requeue: bool = Field(
        True,
        description="Requeue the job when it is preempted or reaches its time limit (sbatch --requeue and "
        "submitit's checkpoint/requeue on USR2); the trainer resumes from its last checkpoint.",
    )
    signal_delay_s: StrictInt = Field(
        90, ge=10, le=3600,
        description="Seconds before the time limit at which Slurm sends USR2 (sbatch --signal=USR2@N), so "
        "training can checkpoint. USR2 because NCCL takes USR1.",
    )
    max_timeouts: StrictInt = Field(
        3, ge=0, le=100, description="How many times a run that reaches its time limit is requeued."
    )

    @field_validator("partition", "account", "qos")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        if v is not None and not _NAME_LIST_RE.match(v):
            raise ValueError("must be Slurm names: letters, digits, _ . + - (comma-separated for several)")
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        if v is not None and not _CONSTRAINT_RE.match(v):
            raise ValueError("must be a Slurm feature expression: names with & | , * ( ) [ ] ! and no blanks")
        return v

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: object) -> object:
        if isinstance(v, int) and not isinstance(v, bool):
            if v >= 60:
                # YAML 1.1 reads an unquoted 2:00:00 as the number 7200 (base 60), which would mean
                # 7200 minutes here. Numbers below 60 cannot come from that, so only those are taken.
                raise ValueError(
                    f"got the number {shorten(str(v))}: quote the time so YAML keeps it as written, e.g. time: '2:00:00' or "
                    "time: '120' (unquoted H:MM:SS is read as a base-60 number)"
                )
            v = str(v)
        if isinstance(v, str):
            try:
                time_to_minutes(v)
            except ValueError:
                raise ValueError(
                    "must be a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. '2:00:00', "
                    f"and at most {MAX_TIME_MINUTES} minutes (Slurm's limit)"
                ) from None
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_memory(v, "sbatch")
            except QuantityError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("folder")
    @classmethod
    def _folder(cls, v: str) -> str:
        if not v or not _PATH_RE.match(v) or "/~" in v:
            raise ValueError(
                "must be a path of letters, digits and _ . / + @ = , - (no blanks, quotes or '%'), "
                "optionally starting with ~/"
            )
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        for line in v:
            _no_control(line)
        return v

    @field_validator("sbatch")
    @classmethod
    def _sbatch(cls, v: dict[str, SbatchValue]) -> dict[str, SbatchValue]:
        for name, value in v.items():
            if not _OPTION_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not an sbatch long option name (lowercase letters, digits, '-')")
            if name in RESERVED_SBATCH:
                raise ValueError(f"{name!r} is set by ddpjob; use the slurm: field for it or leave it to ddpjob")
            if value is False:
                raise ValueError(f"{name}: false is not an sbatch value; remove the option instead")
            if isinstance(value, str):
                try:
                    _no_control(value)
                except ValueError:
                    raise ValueError(f"value of {name} must not contain line breaks or control characters") from None
        return v


# What this target brings (launcher.core.plugins): named by pyproject.toml's ddpjob.targets entry point.
TARGET = TargetPlugin("launcher.targets.slurm.target:SlurmTarget", SlurmOptions, "Options for --target slurm.")
