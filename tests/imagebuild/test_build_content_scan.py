"""Secrets told by content (pure tier: no engine, no registry): the build context is scanned while it
is hashed; a file going in with a private key, a cloud key, a service's token, a kubeconfig's
credentials or a ddpjob spec's secret env value stops the build (exit 2, ``file:line kind value``
masked, before any engine is looked for) until the file is left out (``.ddpjobignore``) or accepted
(an allow comment, ``build.allow_secrets``); big and binary files are not read, and said so; the
project's own tree and well-known packages' sources give no finding.

Every secret-looking value here is made at run time by concatenation, so this file scans clean."""

from __future__ import annotations

import glob
import random
import string
import sys
from pathlib import Path

import pytest

from launcher.service.imagebuild import context as buildctx
from launcher.service.imagebuild import secretscan

REPO = Path(__file__).resolve().parents[2]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
_rng = random.Random(47)


def alnum(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


# The values, made here (a literal would make this file a finding of its own).
GITHUB = "gh" + "p_" + alnum(36)
AWS_ID = "AK" + "IA" + alnum(16, string.ascii_uppercase + "234567")
AWS_SECRET = alnum(18) + "/" + alnum(20) + "a"  # 40 characters, mixed case and digits
KEY_BODY = "\n".join(alnum(64, string.ascii_letters + string.digits + "+/") for _ in range(4))
BEGIN, END = "-----BEGIN ", "-----END "
OPENSSH_KEY = f"{BEGIN}OPENSSH PRIVATE KEY-----\n{KEY_BODY}\n{END}OPENSSH PRIVATE KEY-----\n"
RSA_KEY = f"{BEGIN}RSA PRIVATE KEY-----\n{KEY_BODY}\n{END}RSA PRIVATE KEY-----\n"
NPM = "np" + "m_" + alnum(36)
KUBE_TOKEN = "ey" + alnum(60)
DB_PASSWORD = "pw-z" + alnum(16)


def put(root: Path, rel: str, text: str = "x\n") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def done_when_folder(tmp_path: Path, spec_extra: str = "") -> Path:
    """Issue 47's folder: secrets where real projects keep them."""
    root = tmp_path / "proj"
    put(root, "train.py", "import os\nprint('train')\n")
    put(root, "job.yaml", "name: built\nimage: base:1\ncommand: [python3, train.py]\n"
        f"build: {{registry: 127.0.0.1:5000/team/train, context: .{spec_extra}}}\n")
    put(root, "deploy_key", OPENSSH_KEY)
    put(root, "certs/server.key", RSA_KEY)
    put(root, "config/settings.py", f"DEBUG = False\nAWS_ACCESS_KEY_ID = '{AWS_ID}'\n"
        f"AWS_SECRET_ACCESS_KEY = '{AWS_SECRET}'\n")
    put(root, "notes.txt", f"todo: rotate\nmy token {GITHUB} for the CI\n")
    sa_key = (BEGIN + "PRIVATE KEY-----\\n" + KEY_BODY.replace("\n", "\\n") + "\\n" + END + "PRIVATE KEY-----\\n")
    put(root, "sa.json", '{\n  "type": "service_account",\n  "project_id": "p",\n'
        f'  "private_key": "{sa_key}",\n  "client_email": "a@p.iam.gserviceaccount.com"\n}}\n')
    put(root, ".npmrc", f"//registry.npmjs.org/:_authToken={NPM}\n")
    put(root, "cluster.yaml", "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: https://k:6443}\n"
        f"users:\n- name: admin\n  user:\n    token: {KUBE_TOKEN}\n")
    put(root, "jobs/prod.yaml", "name: prod\ncommand: [python3, train.py]\nenv:\n  SEED: '1'\n"
        f"  DB_PASSWORD: {DB_PASSWORD}\n")
    return root


EXPECTED = [
    "cluster.yaml:9 kubeconfig credentials eyxx",
    "config/settings.py:2 AWS access key pair AKIA…",
    "jobs/prod.yaml:5 secret env value in a ddpjob spec pw-z…",
    "notes.txt:2 GitHub token ghp_…",
    "sa.json:4 GCP service-account key ----…",
]


def shown(findings: list[secretscan.Finding]) -> list[str]:
    # The kubeconfig token's first 4 characters are random beyond 'ey': compare the rest.
    return [f.shown() if not f.masked.startswith("ey") else f"{f.where} {f.kind} eyxx" for f in findings]


def test_the_done_when_folder_is_found_by_content_and_the_rest_left_out_by_name(tmp_path):
    root = done_when_folder(tmp_path)
    ctx = buildctx.scan(root)
    assert shown(ctx.findings) == EXPECTED
    why = {o.rel: o.why for o in ctx.left_out}
    assert why == {"deploy_key": "secret-looking: private key (its first line)",
                   "certs/server.key": "secret-looking: private key", ".npmrc": "secret-looking: registry or package login"}
    assert all(f.masked.endswith("…") and len(f.masked) <= 5 for f in ctx.findings)


def test_a_build_with_findings_stops_before_any_engine_naming_each(tmp_path, cli):
    root = done_when_folder(tmp_path)
    proc = cli("build", str(root / "job.yaml"), cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 2, proc.stderr  # 3 would mean it went on to look for podman
    for line in ("cluster.yaml:9: kubeconfig credentials ", "config/settings.py:2: AWS access key pair AKIA…",
                 "jobs/prod.yaml:5: secret env value in a ddpjob spec pw-", "notes.txt:2: GitHub token ghp_…",
                 "sa.json:4: GCP service-account key ----…"):
        assert line in proc.stderr, proc.stderr
    assert "5 problems found; nothing was built or pushed." in proc.stderr and "Traceback" not in proc.stderr
    assert ".ddpjobignore" in proc.stderr and "ddpjob: allow-secret" in proc.stderr and "allow_secrets" in proc.stderr
    for value in (GITHUB, AWS_ID, AWS_SECRET, KUBE_TOKEN, DB_PASSWORD, KEY_BODY[:20]):
        assert value not in proc.stderr + proc.stdout
    # submit --target k8s stops the same way, before anything is reserved or sent.
    sub = cli("submit", str(root / "job.yaml"), "--target", "k8s", cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert sub.returncode == 2 and "notes.txt:2: GitHub token" in sub.stderr and "nothing was submitted." in sub.stderr, sub.stderr


def test_build_list_shows_the_findings_and_what_was_not_read(tmp_path, cli):
    root = done_when_folder(tmp_path)
    with open(root / "data.bin", "wb") as f:
        f.write(b"\0\1\2" * 100)
    with open(root / "big.txt", "wb") as f:
        f.truncate(secretscan.MAX_SCANNED + 1)
    (root / "big.txt").write_bytes(b"a" * (secretscan.MAX_SCANNED + 1))
    proc = cli("build", str(root / "job.yaml"), "--list", cwd=root, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 2 and "notes.txt:2: GitHub token" in proc.stderr
    out = proc.stdout
    assert "secrets found: 5\n" in out and "  notes.txt:2           GitHub token ghp_…\n" in out, out
    assert "deploy_key" in out and "certs/server.key" in out and "secret-looking: private key" in out
    assert "not scanned for secrets: 2\n" in out and "  big.txt  over 10 MiB" in out and "  data.bin  binary" in out
    assert GITHUB not in out


def test_the_three_ways_on(tmp_path, cli):
    env = {"PATH": str(tmp_path / "empty")}
    # 1. Left out by the ignore file.
    root = done_when_folder(tmp_path / "a")
    put(root, ".ddpjobignore", "notes.txt\nconfig\nsa.json\ncluster.yaml\njobs/\n")
    (root / "weights.bin").write_bytes(b"\0" + GITHUB.encode())  # binary: not read for secrets, and said so
    assert buildctx.scan(root).findings == []
    proc = cli("build", str(root / "job.yaml"), cwd=root, env=env)
    assert proc.returncode == 3 and "podman or docker is not installed" in proc.stderr, proc.stderr
    assert "not scanned for secrets: 1 binary file; --list names them" in proc.stderr
    # 2. Accepted in the spec: a file, or one line of it.
    root = done_when_folder(tmp_path / "b", ", allow_secrets: [notes.txt:2, config/settings.py, sa.json, "
                                            "cluster.yaml:9, ./jobs/prod.yaml]")
    proc = cli("build", str(root / "job.yaml"), "--list", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "secrets found: 0 (and 5 accepted)" in proc.stdout and "(accepted: build.allow_secrets)" in proc.stdout
    # ... a line that is not the one accepted is still found.
    put(root, "notes.txt", f"\n\nmy token {GITHUB}\n")
    proc = cli("build", str(root / "job.yaml"), cwd=root, env=env)
    assert proc.returncode == 2 and "notes.txt:3: GitHub token" in proc.stderr, proc.stderr
    # 3. Accepted on the line: ddpjob's comment, detect-secrets' pragma, or the line before.
    root = done_when_folder(tmp_path / "c")
    put(root, "notes.txt", f"my token {GITHUB}  # ddpjob: allow-secret\n")
    put(root, "config/settings.py", f"A = '{AWS_ID}'  # pragma: allowlist secret\nB = '{AWS_SECRET}'\n")
    put(root, "cluster.yaml", "kind: Config\nusers:\n- name: a\n  user:\n    # pragma: allowlist nextline secret\n"
        f"    token: {KUBE_TOKEN}\n")
    found = [f.where for f in buildctx.scan(root).findings]
    assert found == ["jobs/prod.yaml:5", "sa.json:4"]


KINDS = [
    ("id.txt", OPENSSH_KEY.replace(BEGIN, "x = '''" + BEGIN, 1), "private key"),
    ("pgp.txt", f"note\n{BEGIN}PGP PRIVATE KEY BLOCK-----\n\n{KEY_BODY}\n{END}PGP PRIVATE KEY BLOCK-----\n", "private key"),
    ("s.py", f"k = '{AWS_ID}'\ns = '{AWS_SECRET}'\n", "AWS access key pair"),
    ("azure.cfg", "conn = DefaultEndpointsProtocol=https;AccountName=a;Account" + "Key=" + alnum(86) + "==;\n",
     "Azure storage key"),
    ("a.md", "github_" + "pat_" + alnum(82, string.ascii_letters + string.digits + "_") + "\n", "GitHub token"),
    ("a.md", "gl" + "pat-" + alnum(20) + "\n", "GitLab token"),
    ("a.js", "const t = 'xo" + "xb-" + "1234567890-" + "1234567890123-" + alnum(24) + "'\n", "Slack token"),
    ("a.py", f"t = '{NPM}'\n", "npm token"),
    ("a.py", "t = 'py" + "pi-AgEIcHlwaS5vcmc" + alnum(60) + "'\n", "PyPI token"),
    ("a.py", "t = 'h" + "f_" + alnum(34, string.ascii_letters) + "'\n", "Hugging Face token"),
    ("train.sh", "export WANDB_API" + "_KEY=" + alnum(40, "0123456789abcdef") + "\n", "W&B API key"),
    ("netrc", "machine api.wandb.ai\n  login user\n  password " + alnum(40, "0123456789abcdef") + "\n", "W&B API key"),
    ("netrc.bak", "machine github.com login me password " + alnum(20) + "\n", "netrc password"),
    ("git-credentials", "https://me:" + alnum(24) + "@github.com\n", "URL with a password"),
    ("settings.py", "DB = 'postgres://admin:" + alnum(16) + "@db.internal:5432/app'\n", "URL with a password"),
    ("npmrc.old", "//registry.example.org/:_auth" + "Token=" + alnum(30) + "\n", "npm registry login"),
    ("pypirc.txt", "[pypi]\nusername = __token__\npassword = " + alnum(30) + "\n", "package index password"),
    ("prod.tfvars", 'db_pass' + 'word = "' + alnum(14) + '"\n', "password or secret in configuration"),
    ("spec.yml", "command: [x]\nenv: {SEED: 1, API_TO" + "KEN: " + alnum(12) + "}\n", "secret env value in a ddpjob spec"),
]


@pytest.mark.parametrize(("name", "text", "kind"), KINDS, ids=[f"{k}-{n}" for n, _, k in KINDS])
def test_each_kind_is_found(name, text, kind):
    found = secretscan.scan_text(name, text.encode())
    assert [f.kind for f in found] == [kind], found


NOT_SECRETS = [
    ("howto.md", "A key starts with -----BEGIN RSA PRIVATE KEY----- and ends with its END line.\n"),
    ("aws.md", f"The key id alone: {AWS_ID}; and the documented one AKIAIOSFODNN7EXAMPLE with its pair.\n"),
    ("db.py", "url = 'postgres://user:pass@localhost:5432/db'\nurl2 = 'redis://u:${PASSWORD}@h/0'\n"),
    ("k.yaml", "volumes:\n- name: c\n  secret:\n    secretName: s3-credentials\n"),
    ("conf.ini", "password = <your password here>\nsecret = changeme\n"),
    ("job.yaml", "command: [x]\nenv:\n  SEED: '1'\n  WANDB_PROJECT: demo\nresources: {cpus: 2}\n  API_TOKEN: x\n"),
    ("gh.py", "def ghp_helper(): pass\nsha = 'ghp_' + 'short'\nx = 'xgh" + "p_" + alnum(36) + "'\n"),
    ("aws.py", "k = 'AKIAIOSFODNN7" + "EXAMPLE'\ns = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY'\n"),  # AWS's documented pair
    ("settings.yaml", "secret: FAKE_SECRET_VALUE\npassword: self.db_password\n"),
]


@pytest.mark.parametrize(("name", "text"), NOT_SECRETS, ids=[n for n, _ in NOT_SECRETS])
def test_near_misses_are_not_findings(name, text):
    assert secretscan.scan_text(name, text.encode()) == []


def test_a_value_across_two_reads_is_found_at_its_line(tmp_path):
    root = tmp_path / "ctx"
    cut = (1 << 20) - 10  # the file is read in 1 MiB pieces
    put(root, "log.txt", "x" * (cut - 1) + "\n" + GITHUB + "\n")
    assert [f.where for f in buildctx.scan(root).findings] == ["log.txt:2"]
    assert buildctx.scan(root, secrets=False).findings == []


def _no_findings(root: Path) -> list[str]:
    ctx = buildctx.scan(root)
    assert ctx.scanned
    return [f.shown() for f in ctx.findings]


@pytest.mark.parametrize("folder", ["launcher", "jobs", "docs", "k8s", "slurm", "docker"])
def test_the_projects_own_tree_gives_no_finding(folder):
    if not (REPO / folder).is_dir():
        pytest.skip(f"{folder}/ is not in this checkout")
    assert _no_findings(REPO / folder) == []


def test_the_tests_tree_gives_no_finding_but_its_own_fixtures():
    # Test fixtures that hold secret-like values on purpose are listed here, with why.
    assert _no_findings(REPO / "tests") == []


# torch is ~14,000 files (1.2 GB): its scan takes ~3 s, the slowest test of the pure tier, so it runs in the
# real tier (pyproject.toml: "or is slow"); click and pydantic stay in the pure one.
@pytest.mark.parametrize("package", ["click", "pydantic", pytest.param("torch", marks=pytest.mark.real)])
def test_well_known_packages_give_no_finding(package):
    found = glob.glob(str(SITE / package / "__init__.py"))
    if not found:
        pytest.skip(f"{package} is not installed in {SITE}")
    assert _no_findings(Path(found[0]).parent) == []
