"""Fixtures of the ``build:`` tests: the loopback Kubernetes API server (as in tests/k8s), a real
registry on 127.0.0.1 (``registrykit``) and podman with a small base image already on this machine
(``localhost/ddpjob-base:<codename>``, which ``docker/engine.sh up`` makes; nothing is pulled from
the internet)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "k8s"))
sys.path.insert(0, str(HERE.parent / "container"))

import fake_apiserver  # noqa: E402
from enginekit import engine_up  # noqa: E402
from registrykit import Registry, skip_or_fail, start, stop  # noqa: E402

BASE_IMAGE = "localhost/ddpjob-base:bookworm"


@pytest.fixture
def k8s_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[fake_apiserver.FakeApiServer]:
    """The fake API server (tests/k8s/conftest.py); its pods never start here (the tests read the
    objects), so no training runs."""
    api = fake_apiserver.start(tmp_path / "k8s")
    api.server.pod_start_delay = 3600
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def base_image() -> str:
    """podman, and the small Debian base image the engine script makes, on this machine."""
    if os.environ.get("DDPJOB_CONTAINER_SKIP"):
        pytest.skip(os.environ["DDPJOB_CONTAINER_SKIP"])
    if shutil.which("podman") and subprocess.run(["podman", "image", "exists", BASE_IMAGE],
                                                 capture_output=True, check=False).returncode == 0:
        return BASE_IMAGE
    engine_up()
    return BASE_IMAGE


@pytest.fixture(scope="session")
def train_image() -> str:
    """podman, and the training image the engine script builds (Python and pip in /opt/venv, USER 1000)."""
    if os.environ.get("DDPJOB_CONTAINER_SKIP"):
        pytest.skip(os.environ["DDPJOB_CONTAINER_SKIP"])
    image = os.environ.get("DDPJOB_TEST_IMAGE", "localhost/ddpjob-train:cpu")
    if not (shutil.which("podman") and subprocess.run(["podman", "image", "exists", image],
                                                      capture_output=True, check=False).returncode == 0):
        engine_up()
    return image


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    """A plain-HTTP registry on a free 127.0.0.1 port (tests/registrykit.py), stopped after the test."""
    reg = start(tmp_path / "registry")
    yield reg
    stop(reg)


@pytest.fixture
def registry_with_login(tmp_path: Path) -> Iterator[Registry]:
    """A registry that requires a login (htpasswd); no test logs in."""
    reg = start(tmp_path / "registry-auth", auth=True)
    yield reg
    stop(reg)


CERTS_D = Path("/etc/containers/certs.d")


@pytest.fixture
def registry_tls(tmp_path: Path) -> Iterator[Registry]:
    """A registry over HTTPS with a self-signed certificate, which podman trusts through
    /etc/containers/certs.d/<host:port>/ca.crt (as a user trusts a private registry's CA); removed after."""
    if os.geteuid() != 0:
        skip_or_fail(f"trusting the test registry's certificate needs root ({CERTS_D})")
    reg = start(tmp_path / "registry-tls", tls=True)
    trust = CERTS_D / reg.host
    made = not CERTS_D.exists()
    try:
        trust.mkdir(parents=True)
        shutil.copy(tmp_path / "registry-tls" / "registry.crt", trust / "ca.crt")
        yield reg
    finally:
        shutil.rmtree(trust, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                CERTS_D.rmdir()
        stop(reg)
