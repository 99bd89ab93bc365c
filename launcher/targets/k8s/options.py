"""The ``k8s:`` section of a job spec (options used only by the Kubernetes target).

Everything here ends up in a ``kubeflow.org/v1`` PyTorchJob (see ``launcher.targets.k8s.objects.render``).
Values are checked for what the API server accepts (label syntax, DNS names, quantities), so a
mistake is reported at its line in the spec instead of as a 422 from the cluster. Secrets are only
ever referenced (``secretKeyRef``/``envFrom``), never copied into the manifest.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from launcher.core.fields import ENV_NAME_RE, MAX_CPUS, is_reserved_env
from launcher.core.plugins import TargetPlugin
from launcher.core.quantity import shorten

# DNS-1123 label (namespaces, volume names, configMap/secret/PVC names are subdomains, but a label
# is what most clusters use and is always a valid subdomain).
DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Label/annotation keys: optional DNS-subdomain prefix + '/' + name (<= 63, alphanumeric ends).
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Kubernetes CPU quantity: whole or decimal cores ("2", "1.5") or millicores ("500m").
CPU_QUANTITY_RE = re.compile(r"^([0-9]+(\.[0-9]{1,3})?|[0-9]+m)$")


def _whole_cores(quantity: str) -> str:
    """The whole cores of a CPU quantity that matched ``CPU_QUANTITY_RE``, as digits ("" for none)."""
    if quantity.endswith("m"):
        return quantity[:-1].lstrip("0")[:-3]
    return quantity.split(".")[0].lstrip("0")


# Labels and annotations ddpjob or the operator set; a user value would be overwritten or break tracking.
RESERVED_LABEL_PREFIXES = ("ddpjob/", "training.kubeflow.org/", "kueue.x-k8s.io/")
# What the training operator (v1.9) sets in every container of a PyTorchJob's pods, appended after
# the container's own env (setPodEnv); the kubelet keeps the last value, so a spec's would be
# silently replaced. PYTHONUNBUFFERED=1 always; MASTER_*, WORLD_SIZE, RANK with a Master; PET_*
# (PET_NNODES, PET_NODE_RANK, PET_MASTER_*, PET_NPROC_PER_NODE, the elastic PET_RDZV_* ...).
OPERATOR_ENV = frozenset({"PYTHONUNBUFFERED", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"})


def is_operator_env(name: str) -> bool:
    """Set (or overridden) by the training operator in every pod: a spec may not set it on k8s."""
    return name in OPERATOR_ENV or name.startswith("PET_")


def _check_key(key: str) -> str:
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN_RE.match(prefix)):
        raise ValueError(f"key {key!r}: the prefix before '/' must be a DNS subdomain such as 'example.com'")
    if not name or len(name) > 63 or not _QUALIFIED_NAME_RE.match(name):
        raise ValueError(
            f"key {key!r} must be [prefix/]name with a name of at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return key


def _check_labels(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        _check_key(key)
        if key.startswith(RESERVED_LABEL_PREFIXES):
            raise ValueError(f"label {key!r} is set by ddpjob or the operator (use k8s.queue for Kueue)")
        if len(value) > 63 or not _LABEL_VALUE_RE.match(value):
            raise ValueError(
                f"label value {value!r} must be at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit (or empty)"
            )
    return v


def _check_annotations(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        _check_key(key)
        if key == "sidecar.istio.io/inject":
            raise ValueError("set k8s.istio_inject instead of the sidecar.istio.io/inject annotation")
        if "\x00" in value:
            raise ValueError(f"annotation {key!r} contains a NUL byte")
    return v


def _dns_label(v: str) -> str:
    if len(v) > 63 or not DNS1123_LABEL_RE.match(v):
        raise ValueError(f"{v!r} must be a DNS-1123 label: at most 63 lowercase letters, digits and '-'")
    return v


def _dns_subdomain(v: str) -> str:
    if len(v) > 253 or not DNS1123_SUBDOMAIN_RE.match(v):
        raise ValueError(f"{v!r} must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'")
    return v


def _abs_path(v: str) -> str:
    if not v.startswith("/") or any(ord(c) < 32 for c in v):
        raise ValueError(f"{v!r} must be an absolute path inside the container")
    return v


def _env_name(v: str) -> str:
    if not ENV_NAME_RE.match(v):
        raise ValueError(f"{v!r} is not a valid variable name (letters, digits, '_'; not starting with a digit)")
    if is_reserved_env(v):
        raise ValueError(f"{v} is computed by torchrun/ddpjob/the operator for each process and cannot be set")
    if is_operator_env(v):
        raise ValueError(f"{v} is set by the training operator in every pod, after your env; your value would be replaced "
                         "(with k8s.api trainjob, ddpjob sets it to 1 and a different value goes in env:)")
    return v


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
DnsSubdomain = Annotated[str, AfterValidator(_dns_subdomain)]
ContainerPath = Annotated[str, AfterValidator(_abs_path)]
K8sEnvName = Annotated[str, AfterValidator(_env_name)]


class Toleration(BaseModel):
    """A pod toleration (lets pods run on tainted nodes, e.g. GPU pools)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    key: str | None = Field(None, description="Taint key to tolerate; empty with operator Exists tolerates every taint.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Equal: the taint's value must equal `value`; Exists: any value.")
    value: str | None = Field(None, description="Taint value (operator Equal only).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; empty means all effects."
    )
    toleration_seconds: StrictInt | None = Field(
        None, ge=0, description="NoExecute only: how long the pod stays bound after the taint appears."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("operator Equal needs a key")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds applies only to effect NoExecute")
        if self.key is not None:
            _check_key(self.key)
        return self


class Volume(BaseModel):
    """A volume mounted into the ``pytorch`` container of every replica. Give exactly one source."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    name: DnsLabel = Field(..., description="Volume name (DNS-1123 label, unique; 'dshm' is taken by /dev/shm).")
    mount_path: ContainerPath = Field(..., description="Where the volume appears in the container (absolute path).")
    read_only: StrictBool = Field(False, description="Mount read-only.")
    sub_path: str | None = Field(None, description="Mount only this path inside the volume.")
    pvc: DnsSubdomain | None = Field(None, description="Source: the name of a PersistentVolumeClaim in the job's namespace.")
    config_map: DnsSubdomain | None = Field(None, description="Source: the name of a ConfigMap (its keys become files).")
    secret: DnsSubdomain | None = Field(None, description="Source: the name of a Secret (its keys become files; never rendered as values).")
    host_path: ContainerPath | None = Field(
        None, description="Source: a directory on the node (absolute path). Needs a cluster that allows hostPath."
    )

    @field_validator("sub_path")
    @classmethod
    def _sub_path(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in v.split("/") or any(ord(c) < 32 for c in v)):
            raise ValueError("must be a relative path inside the volume without '..'")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = [k for k in ("pvc", "config_map", "secret", "host_path") if getattr(self, k) is not None]
        if len(sources) != 1:
            raise ValueError(
                "give exactly one source: pvc, config_map, secret or host_path"
                + (f" (got {', '.join(sources)})" if sources else "")
            )
        if self.name == "dshm":
            raise ValueError("the volume name 'dshm' is used for /dev/shm (set its size with resources.shm)")
        if self.mount_path.rstrip("/") == "/dev/shm":
            raise ValueError("/dev/shm is mounted by ddpjob; set its size with resources.shm")
        return self


class ValueRef(BaseModel):
    """One variable taken from a key of a Secret or ConfigMap (rendered as ``valueFrom``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    secret: DnsSubdomain | None = Field(None, description="Name of the Secret holding the value.")
    config_map: DnsSubdomain | None = Field(None, description="Name of the ConfigMap holding the value.")
    key: str = Field(..., min_length=1, description="The key inside the Secret or ConfigMap.")
    optional: StrictBool = Field(False, description="Start the pod even if the Secret/ConfigMap or key is missing.")

    @model_validator(mode="after")
    def _one_source(self) -> ValueRef:
        if (self.secret is None) == (self.config_map is None):
            raise ValueError("give exactly one of secret or config_map")
        if not re.fullmatch(r"[-._A-Za-z0-9]+", self.key):
            raise ValueError(f"key {self.key!r} must consist of letters, digits, '-', '_' or '.'")
        return self


class EnvFromRef(BaseModel):
    """Every key of a Secret or ConfigMap as variables (rendered as ``envFrom``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    secret: DnsSubdomain | None = Field(None, description="Name of the Secret whose keys become variables.")
    config_map: DnsSubdomain | None = Field(None, description="Name of the ConfigMap whose keys become variables.")
    prefix: str | None = Field(None, description="Prefix added to every variable name, e.g. 'WANDB_'.")
    optional: StrictBool = Field(False, description="Start the pod even if the Secret/ConfigMap is missing.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromRef:
        if (self.secret is None) == (self.config_map is None):
            raise ValueError("give exactly one of secret or config_map")
        if self.prefix is not None and not ENV_NAME_RE.match(self.prefix):
            raise ValueError(f"prefix {self.prefix!r} must be a valid start of a variable name")
        return self


class ElasticOptions(BaseModel):
    """Elastic training (``elasticPolicy``): torchrun's c10d rendezvous lets the node count vary in min..max."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    min_nodes: StrictInt = Field(..., ge=1, description="Fewest nodes (replicas, Master included) to train with.")
    max_nodes: StrictInt = Field(..., ge=1, description="Most nodes; `nodes` must lie in min_nodes..max_nodes.")
    rdzv_backend: Literal["c10d"] = Field("c10d", description="Rendezvous backend (c10d: no extra service needed).")
    standalone: StrictBool = Field(
        False,
        description="Refused: the operator then injects PET_STANDALONE='' and torchrun fails parsing it "
        "(int('')). Kept as a field so the spec can say why.",
    )

    @model_validator(mode="after")
    def _range(self) -> ElasticOptions:
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes ({self.max_nodes}) is smaller than min_nodes ({self.min_nodes})")
        if self.standalone:
            raise ValueError(
                "standalone is not supported: the operator sets PET_STANDALONE='' and torchrun cannot parse "
                "it (ValueError at start-up); leave it out"
            )
        return self


class RuntimeRef(BaseModel):
    """The Trainer v2 training runtime a TrainJob references (``spec.runtimeRef``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        "ClusterTrainingRuntime", description="ClusterTrainingRuntime (cluster-wide) or TrainingRuntime (in the job's namespace)."
    )
    name: DnsSubdomain = Field("torch-distributed", description="The runtime's name; it must exist before the TrainJob is created.")


class K8sOptions(BaseModel):
    """Options for ``--target k8s``. Validated as part of every spec; used only by that target."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    api: Literal["pytorchjob", "trainjob"] = Field(
        "pytorchjob",
        description="pytorchjob: a kubeflow.org/v1 PyTorchJob (training operator 1.9). trainjob: a "
        "trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2) that references k8s.runtime.",
    )
    runtime: RuntimeRef = Field(
        default_factory=RuntimeRef, description="api trainjob: the training runtime (default ClusterTrainingRuntime torch-distributed)."
    )
    namespace: DnsLabel | None = Field(None, description="Namespace; default: the kubeconfig context's namespace (else 'default').")
    context: str | None = Field(None, description="kubeconfig context to use; default: the current context.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="imagePullPolicy of the container; default: Kubernetes' (Always for :latest, else IfNotPresent)."
    )
    image_pull_secrets: list[DnsSubdomain] = Field(
        default=[], description="Names of docker-registry Secrets for pulling a private image."
    )
    service_account: DnsSubdomain | None = Field(None, description="serviceAccountName of the pods; default: the namespace's 'default'.")
    node_selector: dict[str, str] = Field(
        default={}, description="nodeSelector labels, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}."
    )
    tolerations: list[Toleration] = Field(default=[], description="Tolerations, e.g. for tainted GPU nodes.")
    priority_class: DnsSubdomain | None = Field(None, description="priorityClassName of the pods.")
    queue: DnsSubdomain | None = Field(
        None, description="Kueue LocalQueue: sets the kueue.x-k8s.io/queue-name label so Kueue admits the job."
    )
    volumes: list[Volume] = Field(default=[], description="Volumes (PVC, ConfigMap, Secret, hostPath) and where to mount them.")
    env_refs: dict[K8sEnvName, ValueRef] = Field(
        default={},
        description="Variables read from a Secret or ConfigMap key (valueFrom), e.g. "
        "{WANDB_API_KEY: {secret: wandb, key: api-key}}. Secret values never appear in the manifest.",
    )
    env_from: list[EnvFromRef] = Field(
        default=[], description="Secrets/ConfigMaps whose keys all become variables (envFrom)."
    )
    annotations: dict[str, str] = Field(default={}, description="Annotations on the PyTorchJob and its pod templates.")
    labels: dict[str, str] = Field(default={}, description="Labels on the PyTorchJob and its pod templates.")
    ttl_seconds_after_finished: StrictInt | None = Field(
        None, ge=0,
        description="Delete the PyTorchJob (and, by garbage collection, its pods and their logs) this long after "
        "it finishes. ddpjob keeps a copy of the logs it has streamed under the job's run directory.",
    )
    elastic: ElasticOptions | None = Field(None, description="Elastic training: min/max nodes (elasticPolicy).")
    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = Field(
        "OnFailure",
        description="OnFailure: the kubelet restarts a failed container in place. ExitCode: the operator "
        "recreates the pod for exit codes >= 128 (signals, OOM) and fails the job for 1-127. Never: any failure fails the job. "
        "Left unset, a PyTorchJob gets ExitCode where ddpjob's pod runner may end the run (2 nodes or more with "
        "recovery, the default, or stall.action fail: its exit 124 is then final), else OnFailure.",
    )
    runner: Literal["python3", "python", "none"] = Field(
        "python3",
        description="How each pod starts ddpjob's pod runner in front of torchrun (the stall watch: heartbeats, "
        "the watch that status reads, stall.action): python3 or python, whichever the image has on its PATH; "
        "none: bare torchrun and no stall watch (an image without Python 3).",
    )
    backoff_limit: StrictInt = Field(3, ge=0, description="runPolicy.backoffLimit: container restarts before the job is marked Failed.")
    istio_inject: StrictBool = Field(
        False, description="Allow Istio sidecars (default false: a sidecar keeps pods alive after training ends)."
    )
    rdma: StrictBool = Field(False, description="The cluster has RDMA/InfiniBand for pods: NCCL_IB_DISABLE=0 instead of 1.")
    workdir: ContainerPath | None = Field(None, description="workingDir of the container; default: the image's WORKDIR.")
    cpu: StrictInt | str | None = Field(
        None,
        description="CPU request per node as a whole number of cores or a quantity string ('500m', '1.5'). "
        "Default: resources.cpus. A bare float such as 0.5 is refused: write '500m'.",
    )

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu_not_float(cls, v: object) -> object:
        if isinstance(v, float):
            # YAML `cpu: 0.5` is a float; the API server would reject it (quantities are strings).
            raise ValueError(f"{v!r} is a float: write a whole number of cores or a quantity string such as '500m'")
        return v

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1 core (or a quantity such as '500m')")
        if isinstance(v, str) and (not CPU_QUANTITY_RE.match(v) or v.strip("0.m") == ""):
            raise ValueError(f"{shorten(v)!r} is not a CPU quantity: use a whole number (2), decimal cores ('1.5') "
                             "or millicores ('500m')")
        # Digits counted before any is converted: 2,000 of them are no number of cores to compute.
        whole = _whole_cores(v) if isinstance(v, str) else str(v)
        if len(whole) > len(str(MAX_CPUS)) or int(whole or 0) > MAX_CPUS:
            raise ValueError(f"{shorten(str(v))} is more cores than one node has (at most {MAX_CPUS})")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_labels(v)

    @field_validator("node_selector")
    @classmethod
    def _node_selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            _check_key(key)
            if len(value) > 63 or not _LABEL_VALUE_RE.match(value):
                raise ValueError(f"node selector value {value!r} is not a valid label value")
        return v

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_annotations(v)

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: list[Volume]) -> list[Volume]:
        names = [vol.name for vol in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"volume name(s) {', '.join(dup)} used more than once")
        paths = [vol.mount_path.rstrip("/") for vol in v]
        dup = sorted({p for p in paths if paths.count(p) > 1})
        if dup:
            raise ValueError(f"mount path(s) {', '.join(dup)} used more than once")
        return v


# What this target brings (launcher.core.plugins): named by pyproject.toml's ddpjob.targets entry point.
TARGET = TargetPlugin("launcher.targets.k8s.target:KubernetesTarget", K8sOptions, "Options for --target k8s.")
