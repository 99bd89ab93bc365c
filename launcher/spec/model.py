"""The job spec: pydantic models, sweep expansion and placeholder substitution.

One spec runs unchanged on every target. The loader that turns a YAML file into a ``JobSpec``
(with file/line/column for every error) lives in ``launcher.spec.load``.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationInfo,
    create_model,
    field_validator,
)

from launcher.core.fields import ENV_NAME_RE, MAX_CPUS, is_reserved_env, no_control
from launcher.core.plugins import PluginError, plugin, target_names
from launcher.core.quantity import QuantityError, parse_memory
from launcher.spec.build import BuildOptions
from launcher.spec.notify import NotifyOptions
from launcher.spec.recovery import RecoveryOptions
from launcher.spec.stall import StallOptions

NAME_MAX = 40
# A sweep of more runs is almost always a mistake (5 lists of 20 values make 3.2 million runs).
MAX_RUNS = 10_000
# DNS-1035 label: what Kubernetes requires of service names, and a safe job name everywhere else.
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NCCL_EXTRA_RE = re.compile(r"^(NCCL|TORCH_NCCL|GLOO|TORCH_DISTRIBUTED)_[A-Z0-9_]+$")
PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")

# Values the placeholders in ``command`` and ``env`` may use besides the sweep parameters.
BUILTIN_PLACEHOLDERS = ("job_id", "sweep_index", "output_dir")

Scalar = StrictInt | float | bool | str


def _env_name(key: str) -> str:
    if not ENV_NAME_RE.match(key):
        raise ValueError(f"{key!r} is not a valid variable name (letters, digits, '_'; not starting with a digit)")
    if is_reserved_env(key):
        raise ValueError(f"{key} is set for each process and cannot be set here: {_who_sets(key)}")
    return key


def _who_sets(key: str) -> str:
    """Who sets a reserved variable, and what in the spec decides it."""
    if key == "MASTER_PORT":
        return "use master_port: to choose the rendezvous port"
    if key == "MASTER_ADDR":
        return "each target decides the rendezvous address (the first node's)"
    if key.startswith("PET_"):
        return "the training operator sets PET_* in a PyTorchJob's pods from nodes and procs_per_node"
    if key.startswith("DDPJOB_"):
        return "ddpjob sets it for each run (docs: ddpjob docs spec)"
    return "torchrun sets it from nodes and procs_per_node"


def _single_line(value: str) -> str:
    return no_control(value, "the value")


def _unique_values(values: list[Scalar]) -> list[Scalar]:
    seen: set[str] = set()
    for value in values:
        text = format_value(value)
        if text in seen:
            raise ValueError(f"{text!r} is listed twice; each value must be unique")
        no_control(text, "a value")
        seen.add(text)
    return values


def _sweep_key(key: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or key in BUILTIN_PLACEHOLDERS:
        raise ValueError(f"sweep parameter {key!r} must be an identifier and not one of {list(BUILTIN_PLACEHOLDERS)}")
    return key


def _scalar_to_str(value: object) -> object:
    # `--epochs, 3` and `SEED: 7` are natural YAML; they mean the strings a process receives.
    return format_value(value) if isinstance(value, (int, float, bool)) else value


CommandArg = Annotated[str, BeforeValidator(_scalar_to_str), AfterValidator(_single_line)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_scalar_to_str), AfterValidator(_single_line)]
SweepValues = Annotated[list[Scalar], Field(min_length=1), AfterValidator(_unique_values)]
SweepKey = Annotated[str, AfterValidator(_sweep_key)]


def sanitize_name(text: str) -> str:
    """Turn any text into a valid job name (used for suggestions and command-only submits)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = "job-" + name
    return name[:NAME_MAX].rstrip("-") or "job"


class NcclOptions(BaseModel):
    """NCCL (and Gloo) settings. Unset fields take each target's default (see ``launcher.targets.shared.dist``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = Field(
        None, description="NCCL_DEBUG level. Default WARN on every target; INFO helps debug hangs."
    )
    ib_disable: bool | None = Field(
        None,
        description="NCCL_IB_DISABLE. Default: true locally and on Kubernetes (unless k8s.rdma), "
        "false on Slurm (HPC fabrics usually have InfiniBand).",
    )
    socket_ifname: str | None = Field(
        None,
        description="NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, e.g. 'eth0' or '^docker,lo'. "
        "Default: 'lo' locally, 'eth0' on Kubernetes, unset on Slurm.",
    )
    extra: dict[str, str] = Field(
        default={},
        description="More variables, e.g. {NCCL_P2P_DISABLE: '1'}. Names must start with NCCL_, "
        "TORCH_NCCL_, GLOO_ or TORCH_DISTRIBUTED_.",
    )

    @field_validator("socket_ifname")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\^?[A-Za-z0-9_.,:^=-]+", v):
            raise ValueError("must be interface names such as 'eth0' or '^lo,docker0'")
        return v

    @field_validator("extra")
    @classmethod
    def _extra(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not NCCL_EXTRA_RE.match(key):
                raise ValueError(
                    f"{key!r} is not an NCCL/Gloo variable; put other variables under env:"
                )
            no_control(value, f"value of {key}")
        return v


# More cores than any one machine has (the largest have a few hundred, 1,792 threads at most).


class Resources(BaseModel):
    """What each node (one torchrun agent) needs."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    cpus: StrictInt | None = Field(
        None, ge=1, le=MAX_CPUS,
        description=f"CPU cores per node (a whole number, at most {MAX_CPUS}). Also sets OMP_NUM_THREADS per process.",
    )
    gpus: StrictInt = Field(0, ge=0, le=1024, description="GPUs per node, at most 1024 (nvidia.com/gpu on "
                            "Kubernetes, --gpus-per-node on Slurm).")
    memory: str | None = Field(
        None, description="Memory per node as a Kubernetes quantity, e.g. '16Gi' (binary) or '16G' (decimal).")
    shm: str = Field(
        "2Gi",
        description="Size of /dev/shm (Kubernetes mounts a memory emptyDir; containers default to 64 MB, "
        "which kills DataLoader workers).",
    )

    @field_validator("memory", "shm")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_memory(v, "quantity")
            except QuantityError as e:
                raise ValueError(str(e)) from None
        return v


class JobSpecBase(BaseModel):
    """A ddpjob job spec. Every field is optional except ``name`` and ``command``.

    The per-target sections (``local:``, ``slurm:``, ``k8s:`` and any installed target's) are added by
    ``spec_model`` from the targets' own options models, so a new target brings its section with it."""

    model_config = ConfigDict(defer_build=True, extra="forbid", title="ddpjob job spec")

    name: str = Field(
        ...,
        description=f"Job name: a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter) "
        f"of at most {NAME_MAX} characters, so derived names (ids, Kubernetes services) fit.",
    )
    image: str | None = Field(
        None, description="Container image (required on Kubernetes; used on Slurm with a container runtime)."
    )
    command: list[CommandArg] = Field(
        ...,
        min_length=1,
        description="The program each process runs, as a list: ['python', 'train.py', '--lr', '{lr}'] or "
        "['python', '-m', 'launcher.train']. Run under torchrun; never through a shell. Placeholders: "
        "sweep parameters, {job_id}, {sweep_index}, {output_dir}; write {{ and }} for literal braces.",
    )
    workdir: str | None = Field(
        None,
        description="Working directory of the command. Relative paths are taken from the spec file's "
        "directory. Default: the directory you submit from (local, Slurm) or the image's WORKDIR (Kubernetes).",
    )
    nodes: StrictInt = Field(1, ge=1, le=1024, description="Number of nodes (torchrun agents).")
    procs_per_node: Annotated[StrictInt, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto", description="Processes per node: an integer from 1, or 'auto' (the node's GPU count, or 1 on CPU)."
    )
    resources: Resources = Field(default_factory=Resources, description="Per-node resources.")
    env: dict[EnvName, EnvValue] = Field(
        default={},
        description="Environment variables for every process. They win over ddpjob's defaults. "
        "RANK, WORLD_SIZE, MASTER_ADDR and friends are computed for you and cannot be set. Values of "
        "names that look secret (*TOKEN*, *SECRET*, *PASSWORD*, *_KEY, ...) and values that are credentials by their "
        "shape (a GitHub or Hugging Face token, a private key, a URL with a password) are shown as ***.",
    )
    env_from_host: list[EnvName] = Field(
        default=[],
        description="Names of variables every process takes from the environment of the shell that submits "
        "(local and Slurm): the value is never written into ddpjob's registry, plans or scripts. "
        "On Kubernetes use k8s.env_refs (a Secret) instead.",
    )
    nccl: NcclOptions = Field(default_factory=NcclOptions, description="NCCL/Gloo settings.")
    master_port: StrictInt | None = Field(
        None, ge=1024, le=65535,
        description="Rendezvous port. Default: chosen per target (a free port locally, derived from the "
        "job id on Slurm, 29500 on Kubernetes).",
    )
    max_restarts: StrictInt = Field(0, ge=0, le=100, description="torchrun --max-restarts: restarts of the whole worker group after a failure.")
    stall: StallOptions = Field(default_factory=StallOptions, description="A node that goes silent or a rank "
                                "that stops (every target): how long until it is reported, and whether the job then ends.")
    recovery: RecoveryOptions = Field(default_factory=RecoveryOptions, description="A node lost for good (every "
                                      "target): how many losses a run survives, each brought back by itself.")
    notify: NotifyOptions | None = Field(None, description="A command and/or URL told once when the job ends.")
    build: BuildOptions | None = Field(None, description="Build image + the working directory, push it and run on its "
                                       "digest (Kubernetes, local.container, Slurm containers); see ddpjob docs build.")
    sweep: dict[SweepKey, SweepValues] = Field(
        default={},
        description="A parameter grid, e.g. {lr: [0.1, 0.01], seed: [1, 2]}: one task per combination "
        "(cartesian product), numbered 0, 1, ... as status, logs --task and cancel --task show them. Each task "
        "substitutes {lr}/{seed} in command and env and gets its index as DDPJOB_SWEEP_INDEX and its own output "
        "folder (sweep-<index>).",
    )
    output_dir: str | None = Field(
        None,
        description="Where tasks write outputs (DDPJOB_OUTPUT_DIR; with a sweep, one sub-folder per task: sweep-<index>). "
        "May contain {job_id}. Default: the job's run directory locally, the Slurm folder on Slurm, "
        "/workspace/outputs/<job id> on Kubernetes.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > NAME_MAX or not NAME_RE.match(v):
            raise ValueError(
                f"must be a DNS-1035 label of at most {NAME_MAX} characters: lowercase letters, digits and "
                "'-', starting with a letter and ending with a letter or digit"
            )
        return v

    @field_validator("env_from_host")
    @classmethod
    def _env_from_host(cls, v: list[str], info: ValidationInfo[object]) -> list[str]:
        for i, name in enumerate(v):
            if name in v[:i]:
                raise ValueError(f"{name} is listed twice")
            if name in (info.data.get("env") or {}):
                raise ValueError(f"{name} is also set in env:; keep one of them")
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep_size(cls, v: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        runs = math.prod(len(values) for values in v.values())
        if runs > MAX_RUNS:
            sizes = " x ".join(str(len(values)) for values in v.values())
            raise ValueError(f"the sweep makes {runs:,} tasks ({sizes} values); at most {MAX_RUNS:,} are allowed: "
                             "split it into several jobs")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (first item) is empty")
        return v


S = TypeVar("S", bound=BaseModel)


class JobSpec(JobSpecBase):
    """A job spec: the common fields and one section per target. The class that validates specs is
    ``spec_model()``, this one with a field for each target's section (each target owns its section's
    model: ``TargetPlugin.options``, found through ``launcher.core.plugins``), validated as part of every
    spec: a typo in ``k8s:`` is found even when running locally. A target reads its own section with
    ``spec.section(ItsOptions)``."""

    def section(self, model: type[S]) -> S:
        """This spec's section of the target whose options model is ``model`` (its defaults when the
        spec has none: a spec validated by this class alone, not by ``spec_model()``)."""
        for name in target_names():
            value = getattr(self, name, None)
            if isinstance(value, model):
                return value
        return model()


@functools.cache
def spec_model() -> type[JobSpec]:
    """``JobSpec`` with a field for each registered target's section (``<name>: <its options>``, described
    by its summary), in the order the targets are registered: the class every spec is validated by.
    A target whose plugin cannot be loaded has no section here (``lookup.get_target`` says why)."""
    fields: dict[str, Any] = {}  # Any: mypy matches a typed **dict against create_model's __config__, __doc__ ... too
    for name in target_names():
        try:
            found = plugin(name)
        except PluginError:
            continue
        fields[name] = (found.options, Field(default_factory=found.options, description=found.summary))
    model: type[JobSpec] = create_model("JobSpec", __base__=JobSpec, __module__=__name__, **fields)
    return model


def format_value(value: object) -> str:
    """How a sweep value is written into a command: YAML's spelling for booleans, str() otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def json_schema() -> dict[str, object]:
    """JSON Schema of the spec, for editors (``ddpjob schema``)."""
    schema = spec_model().model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
