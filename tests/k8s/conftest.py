"""Fixtures for the Kubernetes tests: a loopback API server that plays the training operator."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import fake_apiserver
import trainjob_kit  # noqa: F401 - sets DDPJOB_TRAINJOB_CRD from DDPJOB_SHARED before any cluster starts


@pytest.fixture
def k8s_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A running fake API server; KUBECONFIG points at it for the test's duration.

    Yields ``FakeApiServer`` with ``.kubeconfig``, ``.url`` and ``.server`` (the ``FakeCluster``:
    stored ``jobs``, ``pods``, ``requests``, ``fail_next(method, path_regex, code)``,
    ``crd_installed``, ``pod_start_delay``, ``delete_pods(job)``, ``add_secret``...).
    """
    api = fake_apiserver.start(tmp_path / "k8s")
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
    yield api
    api.close()
