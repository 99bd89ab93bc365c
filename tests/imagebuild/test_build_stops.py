"""Builds that end cleanly: a real registry on 127.0.0.1 frozen (SIGSTOP) mid-push ends ``ddpjob
build`` after the no-progress limit (short here: ``$DDPJOB_BUILD_NO_PROGRESS_S``) with the registry
named; Ctrl-C during ``podman build`` (SIGINT to the command's process group, as a terminal sends
it) exits 130 and leaves ``podman ps -a --external`` and the runtime's containers as they were."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testkit import sigint_default, wait_for

REPO = Path(__file__).resolve().parents[2]
REPO_PATH = "team/train"


def external() -> list[str]:
    """Builds' working containers (podman shows them in state "storage"): not the containers that other
    tests, beside these on another worker, run."""
    rows = subprocess.run(["podman", "ps", "-a", "--external", "--format", "{{.ID}} {{.Names}} {{.State}}"],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    return sorted(row.rsplit(" ", 1)[0] for row in rows.splitlines() if row.lower().endswith(" storage"))


def runtime_containers() -> list[str]:
    """The runtime's containers of builds' RUN steps (``buildah-*``)."""
    rows = subprocess.run(["runc", "list", "-q"], capture_output=True, text=True, check=False, timeout=60).stdout
    return sorted(c for c in rows.split() if c.startswith("buildah-"))


def project(tmp_path: Path, base: str, registry: str, dockerfile: str | None = None) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('hello')\n")
    extra = ""
    if dockerfile is not None:
        (root / "Dockerfile").write_text(dockerfile)
        extra = ", dockerfile: Dockerfile"
    (root / "job.yaml").write_text(f"name: stops\nimage: {base}\ncommand: [python3, train.py]\n"
                                   f"build: {{registry: {registry}, insecure: true, context: .{extra}}}\n")
    return root


def start_build(root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "launcher", "build", str(root / "job.yaml")], cwd=root,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=sigint_default)  # noqa: PLW1509 (no threads here) SIGINT even under nohup


def test_a_registry_that_stops_answering_mid_push_ends_the_build(registry, base_image, tmp_path):
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    (root / "weights.bin").write_bytes(os.urandom(48 << 20))  # a layer that takes a while to send
    proc = start_build(root, {"DDPJOB_BUILD_NO_PROGRESS_S": "4"})
    try:
        # The push has begun once the registry has opened an upload; freeze it then.
        wait_for(lambda: "/blobs/uploads/" in registry.log.read_text(errors="replace") or proc.poll() is not None,
                 "the push to begin", timeout=240, poll=0.02)
        registry.proc.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - frozen
    finally:
        registry.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err
    assert f"the push of {registry.host}/{REPO_PATH}:ctx-" in err and "made no progress for 4 s" in err, err
    assert "Traceback" not in err
    assert took < 60, took


def test_ctrl_c_during_a_build_leaves_no_container(registry, base_image, tmp_path):
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}",
                   "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo ddpjob-ctrl-c-step && sleep 120\n")
    before, runtime_before = external(), runtime_containers()
    bystander = f"ddpjob-test-bystander-{os.getpid()}"
    proc = start_build(root)
    try:
        wait_for(lambda: (len(external()) > len(before) and len(runtime_containers()) > len(runtime_before))
                 or proc.poll() is not None, "the build's RUN step to start", timeout=240, poll=0.3)
        assert proc.poll() is None, proc.communicate()
        # A container of the user's, created while the build runs, is not the build's to remove.
        subprocess.run(["podman", "create", "--name", bystander, base_image, "true"], capture_output=True,
                       check=True, timeout=60)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        _, err = proc.communicate(timeout=60)
        kept = subprocess.run(["podman", "container", "exists", bystander], timeout=60).returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run(["podman", "rm", "-f", bystander], capture_output=True, timeout=60)
    assert kept, "a container created during the build was removed by its Ctrl-C clean-up"
    assert proc.returncode == 130, err
    assert "Stopped." in err and "Traceback" not in err, err
    assert external() == before
    assert runtime_containers() == runtime_before
    listed = subprocess.run(["podman", "images"], capture_output=True, text=True, check=True, timeout=60)
    assert "incomplete" not in listed.stderr.lower(), listed.stderr  # no half-written layer left either
    assert registry.pushes(REPO_PATH) == 0


def test_ctrl_c_beside_another_build_leaves_that_build_alone_and_names_what_it_left(registry, base_image, tmp_path):
    # Neither a working container nor a RUN step's runtime container says which build made it: with
    # another build running, the stopped one removes nothing and prints how to remove its leftovers.
    (tmp_path / "other").mkdir()
    other = project(tmp_path / "other", base_image, f"{registry.host}/{REPO_PATH}",
                    "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo ddpjob-other-step && sleep 30\n")
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}",
                   "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo ddpjob-ctrl-c-step && sleep 120\n")
    before, runtime_before = external(), runtime_containers()
    procs = [start_build(other)]
    try:
        for n, proc in ((1, procs[0]), (2, None)):
            if proc is None:
                procs.append(start_build(root))
            wait_for(lambda n=n: len(runtime_containers()) >= len(runtime_before) + n
                     or any(p.poll() is not None for p in procs), f"{n} RUN step(s) to start", timeout=240, poll=0.3)
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        os.killpg(procs[1].pid, signal.SIGINT)
        _, err = procs[1].communicate(timeout=60)
        _, other_err = procs[0].communicate(timeout=240)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[1].returncode == 130, err
    assert procs[0].returncode == 0, other_err  # the other build ran to its end and pushed
    assert "another image build is running on this machine (pid " in err and "Traceback" not in err, err
    commands = [line.strip() for line in err.splitlines() if line.startswith("  ") and " -f " in line]
    assert any(c.startswith("podman rm -f ") for c in commands), err
    for command in commands:  # what the note says to do, done
        subprocess.run(["sh", "-c", command], capture_output=True, timeout=60, check=True)
    assert external() == before
    assert runtime_containers() == runtime_before
