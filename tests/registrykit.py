"""A real image registry on 127.0.0.1 for the ``build:`` tests: Debian's ``docker-registry``
(the CNCF distribution registry), started per test on a free port with its own storage folder,
never as a system service.

Where the program is missing it is installed with apt-get as root, its service kept from starting
(a ``policy-rc.d`` that refuses, only for that install). Where it cannot be (not root, no apt-get,
apt failed) the tests skip with the reason; with CI=true they fail instead, so CI cannot skip them
silently (as the Slurm and container fixtures do).

The fixtures (``registry``, ``registry_with_login``) are in tests/imagebuild/conftest.py.
``Registry.pushes(repo)`` counts the manifests the registry stored, read from its own request log:
the proof that a second build pushed nothing.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from testkit import wait_for

BINARY = "docker-registry"
POLICY_RC = Path("/usr/sbin/policy-rc.d")


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"registry tests cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def _install() -> str | None:
    """Why ``docker-registry`` cannot be installed here, or None once it is."""
    if os.geteuid() != 0:
        return f"{BINARY} is not installed and installing it needs root (apt-get install docker-registry)"
    if shutil.which("apt-get") is None:
        return f"{BINARY} is not installed and there is no apt-get"
    made_policy = not POLICY_RC.exists()
    if made_policy:  # the package would start its service on port 5000: refuse it for this install
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        # Waits for dpkg's lock (up to 5 minutes): another install may hold it, e.g. slurm/cluster.sh's
        # on the other test worker (CI skipped the registry tests so once).
        cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends", BINARY]
        if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                return f"apt-get could not install {BINARY}: {done.stderr.strip()[-300:]}"
    finally:
        if made_policy:
            POLICY_RC.unlink()
    return None if shutil.which(BINARY) else f"{BINARY} is still missing after apt-get"


def registry_binary() -> str:
    found = shutil.which(BINARY)
    if found is None:
        why = _install()
        if why is not None:
            skip_or_fail(why)
        found = shutil.which(BINARY)
    assert found
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    log: Path
    proc: subprocess.Popen[bytes]
    tls: bool = False

    def pushes(self, repo: str) -> int:
        """Manifests stored under ``repo`` so far (one per push of a tag)."""
        text = self.log.read_text(errors="replace")
        return sum(1 for line in text.splitlines()
                   if "response completed" in line and 'http.request.method=PUT' in line
                   and f"/v2/{repo}/manifests/" in line)

    def answers(self) -> bool:
        context = ssl._create_unverified_context() if self.tls else None  # only: is it up?
        try:
            urllib.request.urlopen(f"{'https' if self.tls else 'http'}://{self.host}/v2/", timeout=2, context=context)
        except urllib.error.HTTPError:
            return True  # 401 with auth on: it answers
        except OSError:
            return False
        return True


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl), as a registry's CA would issue one."""
    cert, key = tmp / "registry.crt", tmp / "registry.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def start(tmp: Path, *, auth: bool = False, tls: bool = False) -> Registry:
    binary = registry_binary()
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    auth_block = ""
    if auth:  # a login is required; the tests never log in, so every request is refused
        (tmp / "htpasswd").write_text("someone:$2y$05$abcdefghijklmnopqrstuu5s7Ys0jHbpcLQtQh2qPdfsXFz0fvpzC\n")
        auth_block = f"auth:\n  htpasswd:\n    realm: ddpjob-test\n    path: {tmp / 'htpasswd'}\n"
    tls_block = ""
    if tls:
        cert, key = self_signed(tmp)
        tls_block = f"  tls:\n    certificate: {cert}\n    key: {key}\n"
    config = tmp / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {tmp / 'storage'}\n  delete:\n    enabled: true\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n{tls_block}{auth_block}")
    log = tmp / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    reg = Registry(f"127.0.0.1:{port}", log, proc, tls)
    try:
        wait_for(lambda: reg.answers() or proc.poll() is not None, "the registry to answer", timeout=30)
    except AssertionError:
        stop(reg)
        raise
    if proc.poll() is not None:
        raise AssertionError(f"{BINARY} exited {proc.returncode}: {log.read_text()[-2000:]}")
    return reg


def stop(reg: Registry) -> None:
    """Stop the registry and remove this machine's images named after it (the tests' builds)."""
    if shutil.which("podman"):
        rows = subprocess.run(["podman", "images", "--format", "{{.ID}} {{.Repository}}"], capture_output=True,
                              text=True, check=False).stdout.splitlines()
        mine = sorted({row.split()[0] for row in rows if len(row.split()) == 2 and row.split()[1].startswith(reg.host + "/")})
        if mine:
            subprocess.run(["podman", "rmi", "-f", *mine], capture_output=True, check=False)
    if reg.proc.poll() is None:
        reg.proc.terminate()
        try:
            reg.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            reg.proc.kill()
            reg.proc.wait()
