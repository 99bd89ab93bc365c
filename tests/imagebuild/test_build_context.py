"""``build:`` without an engine: the ignore rules, the content tag, the size limit, the spec section
and the engine's words classified (pure tier: no process, no network)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.core.errors import SpecError
from launcher.service.imagebuild import context as buildctx
from launcher.service.imagebuild import engine as buildengine
from launcher.service.imagebuild import ignores, pin
from launcher.spec.load import load_spec


@pytest.mark.parametrize(("rules", "path", "out"), [
    ("*.log", "a.log", True),
    ("*.log", "sub/a.log", False),  # * stays within one segment, as in .dockerignore
    ("**/*.log", "sub/deep/a.log", True),
    ("data", "data/x/y.bin", True),  # a left-out folder takes everything in it
    ("/data", "data/y.bin", True),
    ("data/*\n!data/keep.txt", "data/keep.txt", False),  # ! takes a path back; the last match wins
    ("data/*\n!data/keep.txt", "data/drop.txt", True),
    ("!a.txt\n*.txt", "a.txt", True),
    ("# a comment\n\n  ", "x", False),
    ("fil?.py", "file.py", True),
    ("[ab].py", "c.py", False),
    ("[!ab].py", "c.py", True),
])
def test_ignore_rules_follow_dockerignore(rules, path, out):
    assert ignores.excluded(path, ignores.parse_rules(rules)) is out


def make_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: x\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    return root


def tag(root: Path, base: str = "base:1") -> str:
    return buildctx.content_tag(base, pin.generated_dockerfile(base, "/workspace"), buildctx.scan(root))


def test_the_tag_follows_paths_modes_contents_base_and_dockerfile(tmp_path):
    root = make_tree(tmp_path / "ctx")
    first = tag(root)
    assert first == tag(root) and first.startswith("ctx-") and len(first) == 28
    (root / ".git" / "HEAD").write_text("ref: y\n")  # left out by the default ignores
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\1")
    assert tag(root) == first
    assert tag(root, "base:2") != first
    assert buildctx.content_tag("base:1", "FROM base:1\n", buildctx.scan(root)) != first
    (root / "train.py").write_text("print('changed')\n")
    changed = tag(root)
    assert changed != first
    os.chmod(root / "train.py", 0o755)
    assert tag(root) != changed
    (root / "train.py").rename(root / "main.py")
    assert tag(root) not in (first, changed)


def test_an_ignore_file_replaces_the_defaults_and_ddpjobignore_wins(tmp_path):
    root = make_tree(tmp_path / "ctx")
    (root / "big.bin").write_bytes(b"x" * 100)
    (root / ".dockerignore").write_text("big.bin\n")
    ctx = buildctx.scan(root)
    rels = [e.rel for e in ctx.entries]
    assert ctx.ignore_file == ".dockerignore" and "big.bin" not in rels and ".git/HEAD" in rels
    (root / ".ddpjobignore").write_text(".git\n")
    ctx = buildctx.scan(root)
    rels = [e.rel for e in ctx.entries]
    assert ctx.ignore_file == ".ddpjobignore" and "big.bin" in rels and ".git/HEAD" not in rels
    staged = tmp_path / "staged"
    buildctx.stage(ctx, staged)
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*")) == rels


def spec_file(root: Path, extra: str = "") -> Path:
    path = root / "job.yaml"
    path.write_text("name: built\nimage: base:1\ncommand: [python3, train.py]\n"
                    f"build: {{registry: 127.0.0.1:5000/team/train, context: .{extra}}}\n")
    return path


def test_a_context_over_the_limit_names_its_largest_files(tmp_path):
    root = make_tree(tmp_path / "ctx")
    (root / "weights.pt").write_bytes(b"w" * 5000)
    (root / "pkg" / "data.npy").write_bytes(b"d" * 3000)
    loaded = load_spec(spec_file(root, ", max_context: 4Ki"))
    with pytest.raises(SpecError) as e:
        pin.prepare(loaded)
    text = e.value.render()
    assert "build.max_context" in text and "weights.pt (4.9 KiB)" in text and "pkg/data.npy (2.9 KiB)" in text
    assert text.index("weights.pt") < text.index("pkg/data.npy") and ".ddpjobignore" in text
    assert f"{root / 'job.yaml'}:4" in text  # the build: line of the spec


def test_the_spec_section_refuses_what_it_cannot_use(tmp_path):
    for bad, word in (("registry: 127.0.0.1:5000/Team/train", "lowercase"), ("registry: ghcr.io/x:tag", "without tag"),
                      ("engine: buildah", "podman"), ("image_workdir: rel", "absolute"), ("max_context: lots", "a size"),
                      ("registri: x", "registry")):
        path = tmp_path / "bad.yaml"
        path.write_text(f"name: b\ncommand: [x]\nbuild:\n  {bad}\n")
        with pytest.raises(SpecError) as e:
            load_spec(path)
        assert word in e.value.render(), (bad, e.value.render())


def test_an_image_that_would_be_an_option_never_reaches_the_engine(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: b\ncommand: [x]\nimage: --privileged\nbuild: {registry: r.io/x, context: .}\n")
    with pytest.raises(SpecError) as e:
        pin.prepare(load_spec(path))
    assert f"{path}:3" in e.value.render() and "not starting with '-'" in e.value.render()


def test_without_a_registry_or_a_base_the_build_is_refused_at_their_lines(tmp_path, monkeypatch):
    monkeypatch.delenv(pin.REGISTRY_ENV, raising=False)
    path = tmp_path / "job.yaml"
    path.write_text("name: b\ncommand: [x]\nbuild: {engine: podman}\n")
    with pytest.raises(SpecError) as e:
        pin.prepare(load_spec(path))
    text = e.value.render()
    assert "build.registry" in text and pin.REGISTRY_ENV in text and "image:" in text
    monkeypatch.setenv(pin.REGISTRY_ENV, "ghcr.io/me/train")
    path.write_text("name: b\ncommand: [x]\nimage: base:1\nbuild: {}\n")
    assert pin.prepare(load_spec(path)).repository == "ghcr.io/me/train"


@pytest.mark.parametrize(("stderr", "kind"), [
    ('reading manifest ctx-1 in 127.0.0.1:5000/t: manifest unknown: manifest unknown', "absent"),
    ('pinging container registry 127.0.0.1:1: Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: '
     'connection refused', "unreachable"),
    ('Get "https://r:5000/v2/": http: server gave HTTP response to HTTPS client', "unreachable"),
    ('reading manifest x in r/t: authentication required', "auth"),
    ('unauthorized: authentication required', "auth"),
    ('something else went wrong', "other"),
    # a port or tag holding 401/403 is not a refusal (this once made a missing tag read as a login problem)
    ('no such manifest: 127.0.0.1:40157/team/train:ctx-b82d8873183403f1bbd040', "absent"),
    ('denied: requested access to the resource is denied', "auth"),
])
def test_the_engines_words_are_told_apart(stderr, kind):
    assert buildengine.classify(stderr) == kind


def test_render_without_an_engine_says_a_build_is_needed(tmp_path, monkeypatch, cli):
    root = make_tree(tmp_path / "ctx")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    proc = cli("render", str(spec_file(root)), "--target", "k8s", env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 0, proc.stderr
    assert f"image: 127.0.0.1:5000/team/train:{tag(root)}" in proc.stdout  # the tag, with no engine
    assert "whether the registry has it is unknown" in proc.stdout and "podman or docker is not installed" in proc.stdout


def test_an_unreadable_file_in_the_context_is_named(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "ctx")
    (root / "private.dat").write_text("x")

    def refuse(path, needles, seen=None):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(buildctx, "_read", refuse)  # root reads every file: the refusal is simulated
    with pytest.raises(SpecError) as e:
        pin.prepare(load_spec(spec_file(root)))
    assert "cannot be read" in e.value.render() and ".ddpjobignore" in e.value.render()
