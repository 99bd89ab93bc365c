"""Nothing secret ships, end to end: podman builds a working folder that holds an env file, an
``--env-file`` file, private keys and cloud credentials, pushes it to a real registry on 127.0.0.1,
and the image pulled back by digest holds none of them, while a file taken back with ``!`` is there
and everything in it is readable by an unprivileged user. ``submit --target k8s`` says the same
line when it builds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_PATH = "team/train"
WANDB_KEY = "wk-7f3a9c0e5b1d2468ace0"
DB_PASSWORD = "pw-hunter2-hunter2"


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False, timeout=300)


def put(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def working_folder(tmp_path: Path, base: str, registry: str) -> Path:
    root = tmp_path / "proj"
    put(root, "train.py", "print('hello from the image')\n", 0o600)  # private to its owner here
    put(root, "pkg/util.py", "X = 1\n")
    put(root, ".env", f"WANDB_API_KEY={WANDB_KEY}\n")
    put(root, "config/wandb.txt", f"WANDB_API_KEY={WANDB_KEY}\nDB_PASSWORD={DB_PASSWORD}\n", 0o600)
    put(root, "id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
        "-----END OPENSSH PRIVATE KEY-----\n", 0o600)
    put(root, ".aws/credentials", "[default]\naws_secret_access_key = abc/def\n", 0o600)
    put(root, "certs/ca.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    put(root, "certs/server.pem", "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n")
    put(root, "scratch/big.bin", "0" * 4096)
    put(root, ".ddpjobignore", "scratch\n!certs/ca.pem\n")
    # The spec's secret comes from outside the spec (the --env-file): the spec itself holds none.
    put(root, "job.yaml", f"name: built\nimage: {base}\ncommand: [python3, train.py]\nenv: {{SEED: '1'}}\n"
        f"build: {{registry: {registry}, insecure: true, context: .}}\n")
    return root


def image_files(ref: str) -> tuple[list[str], str]:
    """The paths under /workspace of the image pulled back from the registry by digest, listed
    as an unprivileged user (each with its mode and owner), and every file's text read by that user."""
    podman("rmi", "-f", ref)
    pulled = podman("pull", "--tls-verify=false", ref)
    assert pulled.returncode == 0, pulled.stderr
    shown = podman("run", "--rm", "--network=none", "--user", "65534:65534", ref, "sh", "-c",
                   "find /workspace -printf '%m %u %p\\n' | sort -k3 && echo ---- && "
                   "find /workspace -type f -exec cat {} +")
    assert shown.returncode == 0, shown.stderr  # a file or folder that user cannot read fails the cat or find
    listing, _, texts = shown.stdout.partition("----\n")
    return listing.splitlines(), texts


def test_build_leaves_secrets_out_of_the_pushed_image(registry, base_image, tmp_path, cli):
    root = working_folder(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    built = cli("build", str(root / "job.yaml"), "--env-file", "config/wandb.txt", cwd=root)
    assert built.returncode == 0, built.stderr
    said = [line for line in built.stderr.splitlines() if "secret-looking" in line]
    assert said == ["left out of the image as secret-looking: .aws/, .env, certs/server.pem, config/wandb.txt, "
                    "id_rsa (5); take one back with a '!' line in .ddpjobignore"]
    ref = built.stdout.strip()
    assert re.fullmatch(rf"{re.escape(registry.host)}/{REPO_PATH}@sha256:[0-9a-f]{{64}}", ref)
    assert registry.pushes(REPO_PATH) == 1

    listing, texts = image_files(ref)
    paths = {line.split()[2] for line in listing}
    assert paths == {"/workspace", "/workspace/train.py", "/workspace/pkg", "/workspace/pkg/util.py",
                     "/workspace/job.yaml", "/workspace/.ddpjobignore", "/workspace/config", "/workspace/certs",
                     "/workspace/certs/ca.pem"}  # certs/ca.pem: taken back with '!'
    for secret in (".env", "wandb.txt", "id_rsa", ".aws", "credentials", "server.pem", "scratch"):
        assert not [p for p in paths if secret in p], secret
    assert WANDB_KEY not in texts and DB_PASSWORD not in texts and "PRIVATE KEY" not in texts
    assert "hello from the image" in texts and "MIIB" in texts
    modes = {line.split()[2]: (line.split()[0], line.split()[1]) for line in listing}
    assert modes["/workspace/train.py"] == ("644", "root")  # 0600 here, readable by the image's user there
    assert modes["/workspace/pkg"] == ("755", "root")


def test_submit_to_kubernetes_says_what_its_build_left_out(k8s_api, registry, base_image, tmp_path, cli):
    root = working_folder(tmp_path, base_image, f"{registry.host}/{REPO_PATH}")
    # Kubernetes refuses a secret env value in the PyTorchJob: this env file holds ordinary names.
    put(root, "config/vars.txt", "WANDB_PROJECT=demo\n")
    # Not given here, wandb.txt goes in: its password line is accepted (the content scan would stop the build).
    put(root, "config/wandb.txt", f"WANDB_API_KEY={WANDB_KEY}\nDB_PASSWORD={DB_PASSWORD}  # ddpjob: allow-secret\n")
    done = cli("submit", str(root / "job.yaml"), "--target", "k8s", "--env-file", "config/vars.txt", "-q", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("left out of the image as secret-looking: .aws/, .env, certs/server.pem, config/vars.txt, id_rsa (5); "
            "take one back with a '!' line in .ddpjobignore") in done.stderr.splitlines()
    assert re.fullmatch(r"built-[a-z0-9]+\n", done.stdout), done.stdout  # -q: stdout keeps only the id
    (job,) = [r for r in k8s_api.server.requests
              if r["method"] == "POST" and "/pytorchjobs" in r["path"] and "dryRun" not in r["query"]]
    (image,) = set(re.findall(r"'image': '([^']+)'", repr(job["body"])))
    paths = {line.split()[2] for line in image_files(image)[0]}
    # Only the env files given on this command line are left out by path: wandb.txt was not given.
    assert "/workspace/config/wandb.txt" in paths and "/workspace/config/vars.txt" not in paths
    assert "/workspace/.env" not in paths and "/workspace/id_rsa" not in paths
