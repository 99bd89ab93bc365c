"""The two Kubeflow APIs the k8s target speaks (``k8s.api``), as data: pure, free to import.

- ``pytorchjob``: ``kubeflow.org/v1`` PyTorchJob of the training operator 1.9 (the default);
- ``trainjob``: ``trainer.kubeflow.org/v1alpha1`` TrainJob of Kubeflow Trainer v2 (v2.3.0), which
  references a training runtime (ClusterTrainingRuntime ``torch-distributed`` by default).

Each entry says where the objects live (group, version, plural), which CRD the strict check reads
(and from which environment variable offline), the container the controller injects into, how
its pods are selected, and what to install when the API is missing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KubeflowApi:
    """One custom resource the target creates, and what it takes to find its pods."""

    key: str
    kind: str
    group: str
    version: str
    plural: str
    container: str
    pod_label: str
    crd_env: str
    crd_file: str
    controller: str
    install: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    def pod_selector(self, job_name: str) -> str:
        """The label selector of one object's pods."""
        return f"{self.pod_label}={job_name}"


PYTORCHJOB = KubeflowApi(
    key="pytorchjob", kind="PyTorchJob", group="kubeflow.org", version="v1", plural="pytorchjobs",
    container="pytorch", pod_label="training.kubeflow.org/job-name", crd_env="DDPJOB_PYTORCHJOB_CRD",
    crd_file="kubeflow.org_pytorchjobs.yaml", controller="the Kubeflow training operator",
    install='kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"',
)
# Trainer v2 names the JobSet after the TrainJob and JobSet labels every pod with its name; the
# container the torch plugin injects PET_* into is the runtime's `node`.
TRAINJOB = KubeflowApi(
    key="trainjob", kind="TrainJob", group="trainer.kubeflow.org", version="v1alpha1", plural="trainjobs",
    container="node", pod_label="jobset.sigs.k8s.io/jobset-name", crd_env="DDPJOB_TRAINJOB_CRD",
    crd_file="trainer.kubeflow.org_trainjobs.yaml", controller="Kubeflow Trainer v2",
    install=("helm install kubeflow-trainer oci://ghcr.io/kubeflow/charts/kubeflow-trainer --version 2.3.0 "
             "--namespace kubeflow-system --create-namespace --set runtimes.torchDistributed.enabled=true"),
)
APIS = {a.key: a for a in (PYTORCHJOB, TRAINJOB)}


def api_of(key: str | None) -> KubeflowApi:
    """The API for ``k8s.api`` (or a handle's ``api``); unknown or missing: PyTorchJob."""
    return APIS.get(key or "pytorchjob", PYTORCHJOB)
