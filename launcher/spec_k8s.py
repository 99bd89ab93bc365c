"""The ``k8s:`` section of a job spec (options used only by the Kubernetes target)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class K8sOptions(BaseModel):
    """Options for ``--target k8s``. Validated as part of every spec; used only by that target."""

    model_config = ConfigDict(extra="forbid")

    namespace: str | None = Field(None, description="Namespace; default: the kubeconfig context's namespace.")
