"""Nothing secret ships (pure tier: no engine, no registry): secret-looking files stay out of the
build context even where an ignore file does not name them, the ``--env-file`` files too, a ``!``
line takes one back, a spec whose secret values would go into the image is refused (exit 2), ``build
--list`` shows what goes in and why the rest does not, and every path in the image is readable by
its user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.core.errors import SpecError
from launcher.service.imagebuild import context as buildctx
from launcher.service.imagebuild import pin, secretfiles
from launcher.spec.load import load_spec


def put(root: Path, rel: str, text: str = "x\n", mode: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        os.chmod(path, mode)
    return path


def project(tmp_path: Path, spec_extra: str = "") -> Path:
    root = tmp_path / "proj"
    put(root, "train.py", "print('train')\n")
    put(root, "job.yaml", "name: built\nimage: base:1\ncommand: [python3, train.py]\n"
        f"build: {{registry: 127.0.0.1:5000/team/train, context: .}}\n{spec_extra}")
    return root


def inside(ctx: buildctx.Context) -> set[str]:
    return {e.rel for e in ctx.entries}


def why(ctx: buildctx.Context, rel: str) -> str | None:
    return next((o.why for o in ctx.left_out if o.rel == rel), None)


# ---------------------------------------------------------------------------- the defaults, by name


@pytest.mark.parametrize(("rel", "kind"), [
    (".env", "env file"), (".env.production", "env file"), ("deploy/prod.env", "env file"), (".envrc", "env file"),
    ("sub/dir/.env", "env file"),
    ("id_rsa", "private key"), ("id_ed25519", "private key"), ("id_ecdsa", "private key"), ("id_dsa", "private key"),
    ("certs/server.pem", "private key"), ("tls.key", "private key"), ("store.p12", "private key"),
    ("store.pfx", "private key"), (".ssh/config", "private key"),
    (".aws/credentials", "cloud credentials"), (".azure/accessTokens.json", "cloud credentials"),
    ("home/.config/gcloud/application_default_credentials.json", "cloud credentials"),
    ("client_secret_123.apps.json", "cloud credentials"), ("terraform.tfstate", "cloud credentials"),
    (".kube/config", "kubeconfig"), ("kubeconfig", "kubeconfig"), ("prod.kubeconfig", "kubeconfig"),
    ("kubeconfig.yaml", "kubeconfig"),
    (".docker/config.json", "registry or package login"), (".netrc", "registry or package login"),
    (".pypirc", "registry or package login"), (".git-credentials", "registry or package login"),
    (".npmrc", "registry or package login"),
    (".cache/huggingface/token", "token or password file"), (".kaggle/kaggle.json", "token or password file"),
    (".streamlit/secrets.toml", "token or password file"),
])
def test_secret_looking_files_are_left_out_and_say_why(tmp_path, rel, kind):
    root = tmp_path / "ctx"
    put(root, "train.py")
    put(root, rel)
    ctx = buildctx.scan(root)
    assert rel not in inside(ctx) and "train.py" in inside(ctx)
    (hit,) = [o for o in ctx.left_out if rel == o.rel or rel.startswith(o.rel + "/")]
    assert hit.secret and hit.why == f"secret-looking: {kind}"


@pytest.mark.parametrize("rel", [
    "key_points.md", "environment.yml", "env.py", "keys.py", "token.py", "secrets.py", "tokenizer.json",
    "id_rsa.pub", "config.json", ".envoy.yaml", "docs/.aws-notes.md", ".docker/daemon.json",
    ".config/wandb/settings", "kube/deploy.yaml", "monkey.py", "credentials/__init__.py",
    ".github/workflows/ci.yml", "data/keyboard.csv", "README.md",
])
def test_ordinary_files_go_in(tmp_path, rel):
    root = tmp_path / "ctx"
    put(root, rel)
    ctx = buildctx.scan(root)
    assert rel in inside(ctx) and not ctx.secret_left_out


def test_a_private_key_is_known_by_its_first_line_whatever_its_name(tmp_path):
    root = tmp_path / "ctx"
    put(root, "deploy_key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n")
    put(root, "keys/gpg.asc", "\n-----BEGIN PGP PRIVATE KEY BLOCK-----\nxx\n")
    put(root, "ca.crt", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    put(root, "docs/howto.md", "# keys\n\nA key starts with -----BEGIN RSA PRIVATE KEY-----\n")
    ctx = buildctx.scan(root)
    assert why(ctx, "deploy_key") == why(ctx, "keys/gpg.asc") == "secret-looking: private key (its first line)"
    assert {"ca.crt", "docs/howto.md"} <= inside(ctx) and "deploy_key" not in inside(ctx)


def test_an_ignore_file_that_does_not_name_them_leaves_them_out_all_the_same(tmp_path):
    root = tmp_path / "ctx"
    for rel in ("train.py", ".env", "id_rsa", ".aws/credentials", ".aws/config", "scratch/big.bin"):
        put(root, rel)
    put(root, ".dockerignore", "scratch\n")
    ctx = buildctx.scan(root)
    assert inside(ctx) == {".dockerignore", "train.py"}
    assert [(o.shown, o.secret) for o in ctx.left_out] == [
        (".aws/", True), (".env", True), ("id_rsa", True), ("scratch/", False)]
    assert why(ctx, "scratch") == "ignored by .dockerignore"
    line = secretfiles.summary([o.shown for o in ctx.secret_left_out], ctx.ignore_file)
    assert line == ("left out of the image as secret-looking: .aws/, .env, id_rsa (3); take one back with a '!' "
                    "line in .dockerignore")
    # What the user's own file leaves out is theirs: not named as secret-looking.
    put(root, ".dockerignore", "scratch\n.env\n")
    ctx = buildctx.scan(root)
    assert why(ctx, ".env") == "ignored by .dockerignore" and ".env" not in [o.rel for o in ctx.secret_left_out]


def test_a_bang_line_naming_the_path_takes_it_back_and_a_folder_above_it_does_not(tmp_path):
    root = tmp_path / "ctx"
    for rel in ("src/train.py", "src/.env", "certs/ca.pem", "certs/server.pem", ".aws/config", ".aws/credentials"):
        put(root, rel)
    put(root, ".ddpjobignore", "*\n!src\n!certs\n!certs/ca.pem\n!.aws/config\n!.ddpjobignore\n")
    ctx = buildctx.scan(root)
    assert {"src/train.py", "certs/ca.pem", ".aws/config"} <= inside(ctx)
    assert not {"src/.env", "certs/server.pem", ".aws/credentials"} & inside(ctx)
    assert {o.rel for o in ctx.secret_left_out} == {"src/.env", "certs/server.pem"}
    assert why(ctx, ".aws") == "ignored by .ddpjobignore"  # the user's '*': .aws/credentials with it
    # Inside a secret-looking folder, only what a '!' line names comes back.
    put(root, ".ddpjobignore", "!.aws/config\n")
    ctx = buildctx.scan(root)
    assert ".aws/config" in inside(ctx) and ".aws/credentials" not in inside(ctx)
    assert why(ctx, ".aws") == "secret-looking: cloud credentials"
    # A secret-looking file inside a folder the user leaves out and partly takes back is named as such.
    put(root, "data/sub/.env")
    put(root, ".ddpjobignore", "data\n!data/sub\n")
    ctx = buildctx.scan(root)
    assert why(ctx, "data") == "ignored by .ddpjobignore" and why(ctx, "data/sub/.env") == "secret-looking: env file"


def test_the_tag_is_of_what_goes_in(tmp_path):
    root = tmp_path / "ctx"
    put(root, "train.py")
    put(root, ".dockerignore", "scratch\n")

    def tag() -> str:
        return buildctx.content_tag("base:1", "FROM base:1\n", buildctx.scan(root))

    before = tag()
    env = put(root, ".env", "WANDB_API_KEY=one\n")
    assert tag() == before  # left out: not hashed
    env.write_text("WANDB_API_KEY=two\n")
    assert tag() == before
    put(root, ".dockerignore", "scratch\n!.env\n")
    taken_back = tag()
    assert taken_back != before
    env.write_text("WANDB_API_KEY=three\n")
    assert tag() != taken_back  # in the image now: its content counts


# ---------------------------------------------------------------------------- --env-file


def test_the_env_files_given_are_left_out_wherever_they_are(tmp_path, monkeypatch):
    root = tmp_path / "ctx"
    put(root, "train.py")
    given = put(root, "config/wandb.txt", "WANDB_PROJECT=demo\n")
    put(root, "config/other.txt")
    outside = put(tmp_path, "elsewhere/vars.txt")
    assert "config/wandb.txt" in inside(buildctx.scan(root))  # an ordinary name: only --env-file makes it secret
    monkeypatch.chdir(root / "config")
    ctx = buildctx.scan(root, env_files=["wandb.txt", str(outside)])
    assert "config/wandb.txt" not in inside(ctx) and "config/other.txt" in inside(ctx)
    assert why(ctx, "config/wandb.txt") == "given to --env-file"
    (root / "link.txt").symlink_to(given)  # named through a link: the file it names is left out
    ctx = buildctx.scan(root, env_files=[str(root / "link.txt")])
    assert "config/wandb.txt" not in inside(ctx) and "link.txt" not in inside(ctx)
    via = tmp_path / "via"
    via.symlink_to(root)  # the context reached through a linked folder
    assert "config/wandb.txt" not in inside(buildctx.scan(root, env_files=[str(via / "config" / "wandb.txt")]))


def test_submit_build_and_render_say_what_was_left_out(tmp_path, cli):
    root = project(tmp_path)
    put(root, "config/vars.txt", "WANDB_PROJECT=demo\n")
    put(root, ".env", "WANDB_PROJECT=demo\n")
    empty = {"PATH": str(tmp_path / "empty")}  # no engine: render only notes the build
    shown = cli("render", str(root / "job.yaml"), "--target", "k8s", "--env-file", "config/vars.txt", cwd=root,
                env=empty)
    assert shown.returncode == 0, shown.stderr
    assert ("# build: left out of the image as secret-looking: .env, config/vars.txt (2); take one back with a '!' "
            "line in .ddpjobignore\n") in shown.stdout
    listed = cli("build", str(root / "job.yaml"), "--list", "--env-file", "config/vars.txt", cwd=root, env=empty)
    assert listed.returncode == 0 and "config/vars.txt  given to --env-file" in listed.stdout, listed.stderr
    # build says it on stderr before it looks for the engine (none here: exit 3).
    built = cli("build", str(root / "job.yaml"), "-q", "--env-file", "config/vars.txt", cwd=root, env=empty)
    assert built.returncode == 3 and built.stderr.startswith(
        "left out of the image as secret-looking: .env, config/vars.txt (2); take one back"), built.stderr


# ---------------------------------------------------------------------------- secret values in the image


def test_a_spec_in_the_context_with_a_secret_value_is_refused_before_any_engine(tmp_path, cli):
    root = project(tmp_path, "env:\n  SEED: '1'\n  WANDB_API_KEY: wk-0123456789abcdef\n")
    proc = cli("build", str(root / "job.yaml"), cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 2, proc.stderr  # 3 would mean it went on to look for podman
    assert f"{root / 'job.yaml'}:7:3: env.WANDB_API_KEY: is a secret value, and this spec file goes into the image" \
        in proc.stderr
    assert "env_from_host: [WANDB_API_KEY]" in proc.stderr and "--env-file" in proc.stderr
    assert "leave job.yaml out with a line in .ddpjobignore" in proc.stderr
    assert "wk-0123456789abcdef" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    assert "SEED" not in proc.stderr
    # submit --build: the same refusal, nothing submitted.
    sub = cli("submit", str(root / "job.yaml"), "--target", "k8s", cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert sub.returncode == 2 and "env.WANDB_API_KEY: is a secret value" in sub.stderr, sub.stderr
    # Left out of the image by the ignore file, the spec is no longer a problem (podman is, here).
    put(root, ".ddpjobignore", "job.yaml\n")
    ignored = cli("build", str(root / "job.yaml"), cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert ignored.returncode == 3 and "podman or docker is not installed" in ignored.stderr, ignored.stderr


def test_the_secret_rule_is_the_one_k8s_uses(tmp_path, monkeypatch):
    root = project(tmp_path, "env: {MY_DSN: 'host=db.internal dbname=x'}\n")
    pin.prepare(load_spec(root / "job.yaml"))  # not a secret-looking name: builds
    monkeypatch.setenv("DDPJOB_SECRET_ENV", "*_DSN")  # the same setting that masks it and keeps it out of a PyTorchJob
    with pytest.raises(SpecError) as e:
        pin.prepare(load_spec(root / "job.yaml"))
    assert e.value.exit_code == 2 and "env.MY_DSN: is a secret value" in e.value.render()
    assert "db.internal" not in e.value.render()


def test_a_notify_url_in_a_spec_that_goes_in_is_refused_too(tmp_path):
    root = project(tmp_path, "notify: {url: 'https://hooks.example.com/services/T0/B0/abcdef'}\n")
    with pytest.raises(SpecError) as e:
        pin.prepare(load_spec(root / "job.yaml"))
    text = e.value.render()
    assert f"{root / 'job.yaml'}:5:10: notify.url: is a secret value" in text and "--notify-url" in text
    assert "abcdef" not in text


def test_a_file_in_the_context_holding_a_secret_value_is_refused(tmp_path, cli):
    root = project(tmp_path)
    put(tmp_path, "outside/wandb.env", "WANDB_API_KEY=wk-0123456789abcdef\nDB_PASSWORD=abc\n")
    put(root, "notes/setup.txt", "my key: wk-0123456789abcdef\n")
    put(root, "notes/short.txt", "abc\n")  # too short to be searched: ordinary text would match
    proc = cli("build", str(root / "job.yaml"), "--env-file", str(tmp_path / "outside/wandb.env"), cwd=root,
               env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 2, proc.stderr
    assert (f"--env-file {tmp_path / 'outside/wandb.env'}:1: env.WANDB_API_KEY: its value is written in "
            f"{root / 'notes/setup.txt'}, which goes into the image") in proc.stderr
    assert "short.txt" not in proc.stderr and "DB_PASSWORD" not in proc.stderr
    assert "wk-0123456789abcdef" not in proc.stderr and "1 problem found" in proc.stderr
    # --list shows the context, then the same problem (exit 2).
    listed = cli("build", str(root / "job.yaml"), "--list", "--env-file", str(tmp_path / "outside/wandb.env"),
                 cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert listed.returncode == 2 and "notes/setup.txt" in listed.stdout and "tag " not in listed.stdout
    assert "its value is written in" in listed.stderr


def test_a_value_across_two_reads_is_found(tmp_path):
    root = tmp_path / "ctx"
    value = b"s3cr3t-value-0123456789"
    cut = (1 << 20) - 5  # the file is read in 1 MiB pieces
    root.mkdir()
    (root / "big.bin").write_bytes(b"\0" * cut + value + b"\0" * 10)
    ctx = buildctx.scan(root, needles={"env.API_TOKEN": value, "env.OTHER_TOKEN": b"not-there-at-all"})
    assert ctx.holding == [("big.bin", "env.API_TOKEN")]


# ---------------------------------------------------------------------------- build --list


def test_build_list_shows_what_goes_in_and_what_not_without_engine_or_registry(tmp_path, cli, monkeypatch):
    monkeypatch.delenv(pin.REGISTRY_ENV, raising=False)
    root = tmp_path / "proj"
    put(root, "job.yaml", "name: b\nimage: base:1\ncommand: [python3, train.py]\nbuild: {context: .}\n")
    put(root, "train.py", "x" * 2048)
    put(root, "pkg/util.py", "X = 1\n")
    put(root, ".env", "A=1\n")
    put(root, ".aws/credentials")
    put(root, "scratch/big.bin")
    put(root, ".dockerignore", "scratch\n")
    proc = cli("build", str(root / "job.yaml"), "--list", cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"context {root} (rules: .dockerignore, and the secret-looking defaults)"
    assert lines[1] == "in the image at /workspace: 4 files, 1 folder, 2.1 KiB"
    assert lines[2:6] == ["         8 B  .dockerignore", "        71 B  job.yaml", "         6 B  pkg/util.py",
                          "     2.0 KiB  train.py"]
    assert lines[6:10] == ["left out: 3", "              .aws/     secret-looking: cloud credentials",
                           "         4 B  .env      secret-looking: env file",
                           "              scratch/  ignored by .dockerignore"]
    assert lines[10].startswith("left out of the image as secret-looking: .aws/, .env (2)")
    assert lines[11:13] == ["secrets found: 0", "not scanned for secrets: 0"]  # by content: secretscan
    assert lines[13].startswith("tag ctx-") and "no repository yet" in lines[13]
    assert proc.stderr == ""
    help_text = cli("build", "--help").stdout
    assert "--list" in help_text and "ddpjob build train.yaml --list" in help_text and "secret-looking" in help_text


# ---------------------------------------------------------------------------- modes in the image


def test_the_staged_copy_is_readable_by_the_images_user_and_leaves_the_users_files_alone(tmp_path):
    root = tmp_path / "ctx"
    private = put(root, "train.py", mode=0o600)
    script = put(root, "run.sh", mode=0o700)
    plain = put(root, "pkg/util.py", mode=0o644)
    setid = put(root, "tool", mode=0o4755)
    put(root, "hidden/data.txt", mode=0o600)
    os.chmod(root / "hidden", 0o700)
    ctx = buildctx.scan(root)
    staged = tmp_path / "staged"
    buildctx.stage(ctx, staged)

    def mode(path: Path) -> int:
        return stat.S_IMODE(os.lstat(path).st_mode)

    assert {e.rel: e.mode for e in ctx.entries} == {"train.py": 0o644, "run.sh": 0o755, "pkg": 0o755,
                                                   "pkg/util.py": 0o644, "tool": 0o755, "hidden": 0o755,
                                                   "hidden/data.txt": 0o644}
    for e in ctx.entries:  # what is hashed is what is staged
        assert mode(staged / e.rel) == e.mode, e.rel
    assert mode(staged) == 0o755
    assert (mode(private), mode(script), mode(setid)) == (0o600, 0o700, 0o4755)  # the user's own: untouched
    assert os.stat(staged / "train.py").st_ino != os.stat(private).st_ino  # a copy, not a link, when modes differ
    assert os.stat(staged / "pkg/util.py").st_ino == os.stat(plain).st_ino  # a link when they agree
    assert pin.generated_dockerfile("base:1", "/workspace") == "FROM base:1\nWORKDIR /workspace\nCOPY . /workspace\n"


def test_a_folder_made_for_a_path_taken_back_is_enterable(tmp_path):
    root = tmp_path / "ctx"
    put(root, "data/keep.txt")
    put(root, "data/drop.txt")
    put(root, ".ddpjobignore", "data\n!data/keep.txt\n")
    ctx = buildctx.scan(root)
    old = os.umask(0o077)
    try:
        buildctx.stage(ctx, tmp_path / "staged")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "staged" / "data").st_mode) == 0o755
    assert sorted(p.name for p in (tmp_path / "staged" / "data").iterdir()) == ["keep.txt"]


def test_init_writes_a_spec_anyone_can_read_whatever_the_umask(tmp_path):
    proc = subprocess.run(["sh", "-c", f"umask 077 && exec {sys.executable} -m launcher init -o spec.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "spec.yaml").st_mode) == 0o644
