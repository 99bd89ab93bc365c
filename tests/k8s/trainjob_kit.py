"""The Trainer v2 reference material for the TrainJob tests, reached through DDPJOB_SHARED as
``testkit`` does for the PyTorchJob CRD: ``needs_trainjob_crd`` skips (with a reason) without it,
except under CI, where a missing CRD is a broken setup and the tests fail."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
from testkit import SHARED

REFERENCE = SHARED / "reference" / "kubeflow-trainer" if SHARED else None
_CRD = REFERENCE / "trainer.kubeflow.org_trainjobs.yaml" if REFERENCE else None
if os.environ.get("DDPJOB_TRAINJOB_CRD") is None and _CRD is not None and _CRD.exists():
    os.environ["DDPJOB_TRAINJOB_CRD"] = str(_CRD)
TRAINJOB_CRD = os.environ.get("DDPJOB_TRAINJOB_CRD")

needs_trainjob_crd = pytest.mark.skipif(
    not (TRAINJOB_CRD and Path(TRAINJOB_CRD).exists()) and os.environ.get("CI", "").lower() != "true",
    reason="needs the Trainer v2.3 TrainJob CRD: set DDPJOB_SHARED=<the shared/ folder> or DDPJOB_TRAINJOB_CRD=<file> "
           "(trainer.kubeflow.org_trainjobs.yaml of Trainer v2.3.0: see k8s/README.md for where to get it)",
)


@functools.lru_cache(maxsize=1)
def _strict_text() -> str:
    from fake_apiserver import _read_crd

    from launcher.targets.k8s.validation.schema import strict_schema, version_schema

    assert TRAINJOB_CRD and Path(TRAINJOB_CRD).is_file(), "needs the TrainJob CRD (DDPJOB_TRAINJOB_CRD)"
    return json.dumps(strict_schema(version_schema(json.loads(_read_crd(TRAINJOB_CRD)), "v1alpha1")))


def trainjob_schema() -> dict:
    """The upstream TrainJob CRD's v1alpha1 schema made strict (tests marked ``needs_trainjob_crd``)."""
    return json.loads(_strict_text())
