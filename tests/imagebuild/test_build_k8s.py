"""``build:`` end to end: podman builds the spec's image + working directory, pushes it to a real
registry on 127.0.0.1 (Debian's docker-registry, tests/registrykit.py) and the PyTorchJob or
TrainJob created on the loopback API server names it by digest; unchanged files push nothing, a
changed file gives a new digest; every failure exits 2 or 3 with nothing created on the cluster."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from trainjob_kit import needs_trainjob_crd

REPO_PATH = "team/train"
DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}")


def project(tmp_path: Path, base: str, registry: str, extra: str = "") -> Path:
    """A user's working directory: a script, a package, an ignored folder and the spec."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hello from the image')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "scratch").mkdir()
    (root / "scratch" / "big.bin").write_bytes(b"\0" * 4096)
    (root / ".ddpjobignore").write_text("scratch\n")
    (root / "job.yaml").write_text(
        f"name: built\nimage: {base}\ncommand: [python3, train.py]\nnodes: 2\nprocs_per_node: 1\n"
        f"build: {{registry: {registry}, insecure: true, context: .{extra}}}\n")
    return root


def created(k8s_api, plural: str) -> list[dict]:
    return [r for r in k8s_api.server.requests
            if r["method"] == "POST" and f"/{plural}" in r["path"] and "dryRun" not in r["query"]]


def nothing_created(k8s_api) -> bool:
    return not [r for r in k8s_api.server.requests if r["method"] == "POST"]


def images_of(obj: dict) -> list[str]:
    text = repr(obj)
    return re.findall(r"'image': '([^']+)'", text)


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False, timeout=300)


def local_tags(host: str) -> list[str]:
    names = podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    return [n for n in names if n.startswith(host + "/") and not n.endswith(":<none>")]


@needs_trainjob_crd
def test_submit_builds_pins_by_digest_and_reuses_an_unchanged_image(k8s_api, registry, base_image, tmp_path, cli):
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    spec = str(root / "job.yaml")
    # Before any build, render only looks: it names the tag and says a build is needed.
    shown = cli("render", spec, "--target", "k8s", cwd=root)
    assert shown.returncode == 0, shown.stderr
    assert "is not in the registry yet" in shown.stdout and not DIGEST_RE.search(shown.stdout)
    assert registry.pushes(REPO_PATH) == 0 and nothing_created(k8s_api)

    first = cli("submit", spec, "--target", "k8s", cwd=root)
    assert first.returncode == 0, first.stdout + first.stderr
    (job,) = created(k8s_api, "pytorchjobs")
    (image,) = set(images_of(job["body"]))
    assert image.startswith(f"{registry.host}/{REPO_PATH}@sha256:") and DIGEST_RE.search(image)
    assert registry.pushes(REPO_PATH) == 1

    # Pulled back by digest (the local copy removed first), the image's working dir holds the files.
    podman("rmi", "-f", image)
    if local_tags(registry.host):
        podman("rmi", "-f", *local_tags(registry.host))
    pulled = podman("pull", "--tls-verify=false", image)
    assert pulled.returncode == 0, pulled.stderr
    listing = podman("run", "--rm", "--network=host", image, "sh", "-c", "pwd; find . -type f | sort; cat train.py")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.split("\n")[0] == "/workspace"
    assert "./train.py" in listing.stdout and "./pkg/util.py" in listing.stdout and "./job.yaml" in listing.stdout
    assert "scratch" not in listing.stdout and "hello from the image" in listing.stdout

    # Render now finds it; a TrainJob of the unchanged directory builds and pushes nothing.
    again = cli("render", spec, "--target", "k8s", cwd=root)
    assert f"image: {image}" in again.stdout and "found in the registry" in again.stdout
    second = cli("submit", spec, "--target", "k8s", "--set", "k8s.api=trainjob", cwd=root)
    assert second.returncode == 0, second.stdout + second.stderr
    (trainjob,) = created(k8s_api, "trainjobs")
    assert set(images_of(trainjob["body"])) == {image}
    assert registry.pushes(REPO_PATH) == 1  # nothing pushed
    assert local_tags(registry.host) == []  # nor built (the pulled image has no tag; a build would tag it)

    # A changed file: a new digest, pushed once.
    (root / "pkg" / "util.py").write_text("X = 2\n")
    third = cli("submit", spec, "--target", "k8s", "--set", "k8s.api=trainjob", cwd=root)
    assert third.returncode == 0, third.stdout + third.stderr
    new = set(images_of(created(k8s_api, "trainjobs")[-1]["body"]))
    assert len(new) == 1 and new != {image} and DIGEST_RE.search(new.pop())
    assert registry.pushes(REPO_PATH) == 2


def test_build_command_and_submit_build_with_a_registries_conf(registry, base_image, tmp_path, cli):
    """`ddpjob build` prints the pinned reference; `submit --build` needs no build: section. The
    registry is marked insecure in a registries.conf, as a user would for a registry without TLS,
    so the engine's default TLS path is the one used."""
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
    env = {"CONTAINERS_REGISTRIES_CONF": str(conf), "DDPJOB_BUILD_REGISTRY": f"{registry.host}/{REPO_PATH}"}
    (root / "job.yaml").write_text(f"name: built\nimage: {base_image}\ncommand: [python3, train.py]\n")
    built = cli("build", "-q", str(root / "job.yaml"), cwd=root, env=env)
    assert built.returncode == 0, built.stderr
    ref = built.stdout.strip()
    assert re.fullmatch(rf"{re.escape(registry.host)}/{REPO_PATH}@sha256:[0-9a-f]{{64}}", ref)
    assert registry.pushes(REPO_PATH) == 1
    again = cli("build", str(root / "job.yaml"), cwd=root, env=env)
    assert again.stdout.strip() == ref and "nothing built or pushed" in again.stderr
    dry = cli("submit", str(root / "job.yaml"), "--target", "k8s", "--build", "--dry-run", cwd=root, env=env)
    assert dry.returncode == 0 and f"image: {ref}" in dry.stdout, dry.stderr
    shown = cli("render", str(root / "job.yaml"), "--target", "k8s", "--build", cwd=root, env=env)
    assert shown.stdout == dry.stdout
    plain = cli("render", str(root / "job.yaml"), "--target", "k8s", "--set", f"image={base_image}", cwd=root, env=env)
    assert ref not in plain.stdout and "# build:" not in plain.stdout  # without --build: no build
    assert registry.pushes(REPO_PATH) == 1


# ---------------------------------------------------------------------------- failures: nothing created


def submit_fails(cli, k8s_api, root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = cli("submit", str(root / "job.yaml"), "--target", "k8s", *args, cwd=root, env=env)
    assert nothing_created(k8s_api), k8s_api.server.requests
    assert "Traceback" not in proc.stderr
    return proc


def test_no_engine(k8s_api, tmp_path, cli):
    root = project(tmp_path, "base:1", "127.0.0.1:5000/team/train", ", engine: podman")
    proc = submit_fails(cli, k8s_api, root, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 3 and "podman is not installed" in proc.stderr, proc.stderr


def test_registry_unreachable(k8s_api, base_image, tmp_path, cli):
    from registrykit import free_port

    root = project(tmp_path, base_image, f"127.0.0.1:{free_port()}/team/train")
    proc = submit_fails(cli, k8s_api, root)
    assert proc.returncode == 3 and "cannot be reached" in proc.stderr and "connection refused" in proc.stderr


def test_registry_without_tls_needs_insecure(k8s_api, registry, base_image, tmp_path, cli):
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    proc = submit_fails(cli, k8s_api, root, "--set", "build.insecure=false")
    assert proc.returncode == 3 and "build.insecure: true" in proc.stderr, proc.stderr


def test_authentication_refused(k8s_api, registry_with_login, base_image, tmp_path, cli):
    root = project(tmp_path, base_image, f"{registry_with_login.host}/{REPO_PATH}")
    proc = submit_fails(cli, k8s_api, root)
    assert proc.returncode == 3 and "refused" in proc.stderr, proc.stderr
    assert f"podman login {registry_with_login.host}" in proc.stderr
    assert registry_with_login.pushes(REPO_PATH) == 0


def test_context_over_the_limit(k8s_api, tmp_path, cli):
    root = project(tmp_path, "base:1", "127.0.0.1:5000/team/train", ", max_context: 2Ki")
    (root / "weights.pt").write_bytes(b"w" * 3000)
    proc = submit_fails(cli, k8s_api, root)
    assert proc.returncode == 2 and "weights.pt (2.9 KiB)" in proc.stderr and "build.max_context" in proc.stderr
    assert "scratch" not in proc.stderr  # ignored files do not count


def test_base_image_cannot_be_pulled(k8s_api, registry, base_image, tmp_path, cli):
    root = project(tmp_path, f"{registry.host}/no/such-base:1", f"{registry.host}/{REPO_PATH}")
    proc = submit_fails(cli, k8s_api, root)
    assert proc.returncode == 3 and "base image" in proc.stderr and "cannot pull" in proc.stderr, proc.stderr
    assert registry.pushes(REPO_PATH) == 0


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_dry_run_never_builds(k8s_api, registry, base_image, tmp_path, cli, api):
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    proc = cli("submit", str(root / "job.yaml"), "--target", "k8s", "--dry-run", "--set", f"k8s.api={api}", cwd=root)
    assert proc.returncode == 0 and "is not in the registry yet" in proc.stdout, proc.stderr
    assert registry.pushes(REPO_PATH) == 0 and nothing_created(k8s_api)


def test_local_and_slurm_containers_run_the_pinned_image(registry, base_image, tmp_path, cli):
    """The same build: serves local.container and the Slurm runtimes that take the submitting
    machine's image (podman, oci); elsewhere the plan says build: is not used."""
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    spec = str(root / "job.yaml")
    ref = cli("build", "-q", spec, cwd=root).stdout.strip()
    assert DIGEST_RE.search(ref), ref
    for target, setting in (("local", "local.container=podman"), ("slurm", "slurm.container.runtime=podman"),
                            ("slurm", "slurm.container.runtime=oci")):
        shown = cli("render", spec, "--target", target, "--set", setting, cwd=root)
        assert shown.returncode == 0, shown.stderr
        assert ref in shown.stdout and "found in the registry" in shown.stdout, (setting, shown.stdout[-2000:])
    for target, setting in (("local", "local.container=none"), ("slurm", "slurm.container.image=other:1")):
        shown = cli("render", spec, "--target", target, "--set", setting, "--set", "slurm.container.runtime=podman",
                    cwd=root)
        assert shown.returncode == 0, shown.stderr
        assert ref not in shown.stdout and f"build: not used: the {target} target does not run the spec's image" in shown.stdout
    assert registry.pushes(REPO_PATH) == 1
    # This machine's podman knows the image by its digest: a container starts without a pull.
    listing = podman("run", "--rm", "--network=none", "--pull=never", ref, "ls")
    assert listing.returncode == 0 and "train.py" in listing.stdout, listing.stderr


def test_a_tls_registry_needs_nothing_but_the_engines_trust(k8s_api, registry_tls, base_image, tmp_path, cli):
    """The user path: a registry with TLS, build.insecure left false; podman verifies the certificate
    with the CA the machine trusts (certs.d). Untrusted, the submit stops at the certificate (exit 3)."""
    root = project(tmp_path, base_image, f"{registry_tls.host}/{REPO_PATH}")
    spec = root / "job.yaml"
    spec.write_text(spec.read_text().replace("insecure: true", "insecure: false"))
    done = cli("submit", str(spec), "--target", "k8s", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = created(k8s_api, "pytorchjobs")
    assert {i.split("@")[0] for i in images_of(job["body"])} == {f"{registry_tls.host}/{REPO_PATH}"}
    assert DIGEST_RE.search(images_of(job["body"])[0]) and registry_tls.pushes(REPO_PATH) == 1
    shutil.rmtree(Path("/etc/containers/certs.d") / registry_tls.host)  # the fixture's trust, taken back
    (root / "train.py").write_text("print('changed')\n")
    refused = cli("submit", str(spec), "--target", "k8s", cwd=root)
    assert refused.returncode == 3 and "cannot be reached" in refused.stderr and "certificate" in refused.stderr, \
        refused.stderr
    assert len(created(k8s_api, "pytorchjobs")) == 1 and registry_tls.pushes(REPO_PATH) == 1


@pytest.mark.skipif(shutil.which("docker") is None, reason="the docker client is not installed here")
def test_docker_finds_the_same_tag_and_says_when_its_daemon_is_down(k8s_api, registry, base_image, tmp_path, cli):
    """The tag does not depend on the engine: docker's client finds what podman pushed (its registry
    calls need no daemon). Where docker's daemon does not answer, a build says so (exit 3)."""
    root = project(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    spec = str(root / "job.yaml")
    ref = cli("build", "-q", spec, cwd=root).stdout.strip()
    shown = cli("render", spec, "--target", "k8s", "--set", "build.engine=docker", cwd=root)
    assert f"image: {ref}" in shown.stdout, shown.stdout[-1500:] + shown.stderr
    if subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=60).returncode == 0:
        return  # a working daemon: nothing more to show here
    (root / "train.py").write_text("print('changed')\n")
    proc = submit_fails(cli, k8s_api, root, "--set", "build.engine=docker")
    assert proc.returncode == 3 and "daemon does not answer" in proc.stderr, proc.stderr
