"""A real container engine (podman) and the training image, as pytest fixtures.

``engine_image`` (session scope) runs ``docker/engine.sh up``: it installs and configures podman,
makes the Debian base image and builds the CPU test image, or finds them ready (``up`` is
idempotent and cached: a few seconds then). It yields the image's name.

Tests skip with the reason where no engine can run here: not root, podman cannot be installed
(exit 4), podman cannot run a container on this kernel (exit 5), or ``DDPJOB_CONTAINER_SKIP`` says
why (``.ci/run`` sets it when the image build did not fit its time budget; it also passes the
result of its own ``up`` as ``DDPJOB_ENGINE_UP_RC``, so the tests do not run it twice). With CI=true the
first three fail instead, so CI cannot skip them silently. Any other failure of ``up`` (no base
image, a failed build) is an error.

``bridge_image`` adds what ``local.network: bridge`` needs: podman makes an internal network on a
free private subnet and two containers on it reach each other at their own addresses. Where it
cannot, the tests that need it skip with podman's reason (fail under CI=true).

Every test gets its containers and networks removed afterwards: those named after the jobs of its
own ``DDPJOB_HOME`` (``ddpjob-<job id>-<task>-<node>``, ``ddpjob-<job id>``), so a failed test
leaves none behind and other sessions' are never touched.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from enginekit import engine_sh, engine_up, job_containers, job_networks, podman, skip_or_fail

from launcher.targets.local import network


@pytest.fixture(scope="session")
def engine_image() -> str:
    engine_up()
    first = engine_sh("env").stdout.splitlines()[0]
    assert first.startswith("export DDPJOB_TEST_IMAGE="), first
    return first.split("=", 1)[1]


@pytest.fixture(scope="session")
def bridge_image(engine_image: str) -> str:
    """The image, where podman's bridge networking works here (local.network: bridge)."""
    probe = f"probe{os.getpid()}"
    name = network.network_name(probe)
    subnet = network.pick_subnet(probe, network.used_subnets("podman"))
    if subnet is None:
        skip_or_fail(f"no free /{network.PREFIX} of {network.POOL} on this machine for a bridge network")
    why = network.create(network.create_argv("podman", name, str(subnet), probe))
    if why is not None:
        skip_or_fail(f"podman cannot make a bridge network here: {why}")
    try:
        server, client = network.node_address(str(subnet), 0), network.node_address(str(subnet), 1)
        listen = ("import socket; s = socket.socket(); s.bind(('', 5000)); s.listen(); c, a = s.accept(); "
                  "c.sendall(a[0].encode())")
        talk = (f"import socket, time\nfor _ in range(100):\n  try: s = socket.create_connection(('{server}', 5000), 2)"
                "\n  except OSError: time.sleep(0.1)\n  else: break\nprint(s.recv(64).decode())")
        podman("run", "-d", "--rm", "--name", f"{name}-0-0", "--network", name, "--ip", server, engine_image,
               "python", "-c", listen, check=False)
        proc = podman("run", "--rm", "--name", f"{name}-0-1", "--network", name, "--ip", client, engine_image,
                      "python", "-c", talk, check=False)
        if proc.returncode != 0 or proc.stdout.strip() != client:
            skip_or_fail(f"two containers on a podman bridge network cannot talk here: {proc.stderr.strip()}")
    finally:
        podman("rm", "-f", "-t", "0", f"{name}-0-0", f"{name}-0-1", check=False)
        network.remove("podman", name)
    return engine_image


@pytest.fixture(autouse=True)
def remove_job_containers(ddpjob_home: Path) -> Iterator[None]:
    yield
    try:
        left, nets = job_containers(ddpjob_home), job_networks(ddpjob_home)
    except (OSError, AssertionError):
        return  # no podman here: nothing to remove
    if left:
        podman("rm", "-f", "-t", "0", *left, check=False)
        warnings.warn(f"removed containers {left} this test left behind", stacklevel=1)
    if nets:
        podman("network", "rm", *nets, check=False)
        warnings.warn(f"removed networks {nets} this test left behind", stacklevel=1)
