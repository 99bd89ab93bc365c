"""``build.requirements``: the project's declared requirements go into a layer of their own. A wheel
this test makes itself, found through ``--find-links wheels`` in the context (no network), is
installed by a real podman build on the training image and pushed to a real registry; a second
build with changed code reuses that layer (same layer digest: pip did not run again), a changed
requirement gives a new one; the image's own user runs the job and imports the package. Spec
mistakes (a missing file, a path leaving the context, with build.dockerfile) exit 2 naming the field."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

from launcher.service.imagebuild import requirements

REPO_PATH = "team/reqs"
PKG = "ddpjob_reqtest"


def wheel(folder: Path, version: str) -> Path:
    """A pure-Python wheel of ``ddpjob-reqtest`` (its module says its version), as pip builds one."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{PKG}-{version}.dist-info"
    files = {f"{PKG}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: ddpjob-reqtest\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ddpjob-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{PKG}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def project(tmp_path: Path, image: str, registry: str, extra: str = "") -> Path:
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    (root / "train.py").write_text(f"import {PKG}\nprint('version', {PKG}.VERSION)\n")
    wheel(root / "wheels", "0.1")
    (root / "requirements.txt").write_text("--no-index\n--find-links wheels\nddpjob-reqtest==0.1\n")
    (root / "job.yaml").write_text(f"name: reqs\nimage: {image}\ncommand: [python, train.py]\n"
                                   f"build: {{registry: {registry}, insecure: true, context: ., "
                                   f"requirements: requirements.txt{extra}}}\n")
    return root


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False, timeout=300)


def layers(ref: str) -> list[str]:
    shown = podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref)
    assert shown.returncode == 0, shown.stderr
    return list(json.loads(shown.stdout))


def build(cli, root: Path) -> str:
    done = cli("build", str(root / "job.yaml"), "-q", cwd=root)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_requirements_are_installed_in_a_layer_that_changes_only_with_them(registry, train_image, tmp_path, cli):
    root = project(tmp_path, train_image, f"{registry.host}/{REPO_PATH}")
    first = build(cli, root)
    ran = podman("run", "--rm", "--network=none", first, "sh", "-c", "id -u && python train.py")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1000", "version", "0.1"]  # the base's own user runs it, the package is there

    (root / "train.py").write_text(f"import {PKG}\nprint('changed code', {PKG}.VERSION)\n")
    second = build(cli, root)
    assert second != first
    one, two = layers(first), layers(second)
    assert len(one) == len(two) and one[:-1] == two[:-1]  # the install layer reused: pip did not run again
    assert one[-1] != two[-1]  # only the context's layer is new

    wheel(root / "wheels", "0.2")
    (root / "requirements.txt").write_text("--no-index\n--find-links wheels\nddpjob-reqtest==0.2\n")
    third = build(cli, root)
    three = layers(third)
    base = len(layers(train_image))
    assert three[:base] == one[:base] and three[:-1] != one[:-1]  # a changed requirement: a new install layer
    ran = podman("run", "--rm", "--network=none", third, "python", "train.py")
    assert ran.stdout.split() == ["changed", "code", "0.2"], ran.stderr
    assert registry.pushes(REPO_PATH) == 3


def listed(cli, root: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    return cli("build", str(root / "job.yaml"), "--list", *(f"--set={s}" for s in sets), cwd=root)


def test_requirements_spec_mistakes_exit_2_naming_the_field(tmp_path, cli):
    root = project(tmp_path, "localhost/base:1", "127.0.0.1:5000/team/reqs")
    missing = listed(cli, root, "build.requirements=reqs/none.txt")
    assert missing.returncode == 2 and "build.requirements" in missing.stderr
    assert "reqs/none.txt is not in the context" in missing.stderr, missing.stderr

    outside = listed(cli, root, "build.requirements=../requirements.txt")
    assert outside.returncode == 2 and "build.requirements" in outside.stderr and "inside the context" in outside.stderr

    (root / "requirements.txt").write_text("-r ../../etc/more.txt\n./wheels/nowhere.whl\n")
    named = listed(cli, root)
    assert named.returncode == 2 and "not a plain path inside the context" in named.stderr, named.stderr
    assert "names ./wheels/nowhere.whl, which is not in the context" in named.stderr

    (root / "requirements.txt").write_text("torch\n")
    (root / ".ddpjobignore").write_text("requirements.txt\n")
    ignored = listed(cli, root)
    assert ignored.returncode == 2 and "requirements.txt is left out of the context" in ignored.stderr

    (root / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n")
    both = listed(cli, root, "build.dockerfile=Dockerfile")
    assert both.returncode == 2 and "with build.dockerfile" in both.stderr, both.stderr
    for proc in (missing, outside, named, ignored, both):
        assert "Traceback" not in proc.stderr


def test_the_install_step_copies_only_what_the_requirements_name(tmp_path):
    root = tmp_path / "ctx"
    (root / "deps" / "wheels").mkdir(parents=True)
    (root / "deps" / "wheels" / "a.whl").write_text("")
    (root / "deps" / "more.txt").write_text("-e ./local\n")
    (root / "deps" / "local").mkdir()
    (root / "deps" / "requirements.txt").write_text("# comment\n-f wheels\n--requirement=more.txt\nnumpy>=1 ; python_version>'3'\n"
                                                     "-f https://example.org/wheels\n")
    (root / "train.py").write_text("")
    in_ctx = {"deps", "deps/wheels", "deps/wheels/a.whl", "deps/more.txt", "deps/local", "deps/requirements.txt",
              "train.py"}
    reqs = requirements.read(root, "deps/requirements.txt", in_ctx)
    assert reqs.problems == []
    assert reqs.inputs == ["deps/local", "deps/more.txt", "deps/requirements.txt", "deps/wheels"]
    assert reqs.dockerfile_lines() == (
        "ARG DDPJOB_BASE_USER=root\nUSER root\n"
        'COPY ["deps/local", "/opt/ddpjob/requirements/deps/local"]\n'
        'COPY ["deps/more.txt", "/opt/ddpjob/requirements/deps/more.txt"]\n'
        'COPY ["deps/requirements.txt", "/opt/ddpjob/requirements/deps/requirements.txt"]\n'
        'COPY ["deps/wheels", "/opt/ddpjob/requirements/deps/wheels"]\n'
        "WORKDIR /opt/ddpjob/requirements/deps\n"
        'RUN ["python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "-r", '
        '"requirements.txt"]\nUSER ${DDPJOB_BASE_USER}\n')

    (root / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["tensorboardX>=2", "a; b\'c"]\n')
    reqs = requirements.read(root, "pyproject.toml", in_ctx | {"pyproject.toml"})
    assert reqs.problems == [] and reqs.deps == ["tensorboardX>=2", "a; b'c"]
    assert ('RUN ["python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", '
            '"tensorboardX>=2", "a; b\'c"]\n') in reqs.dockerfile_lines()  # exec form: no shell sees it
    (root / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert "has no [project] dependencies" in requirements.read(root, "pyproject.toml", in_ctx).problems[0]
