"""Secrets told by content, end to end (issue 47's done-when): podman and a real registry on
127.0.0.1. The folder with secrets where real projects keep them is refused with nothing pushed;
once its findings are left out (``.ddpjobignore``) or accepted (an allow comment), the image pulled
back by digest holds none of the files left out, and the accepted one."""

from __future__ import annotations

import pytest
from test_build_content_scan import GITHUB, done_when_folder, put
from test_build_no_secrets import REPO_PATH, image_files

pytestmark = pytest.mark.real


def test_a_folder_with_secrets_pushes_nothing_until_each_is_left_out_or_accepted(registry, base_image, tmp_path, cli):
    root = done_when_folder(tmp_path)
    put(root, "job.yaml", f"name: built\nimage: {base_image}\ncommand: [python3, train.py]\n"
        f"build: {{registry: {registry.host}/{REPO_PATH}, insecure: true, context: .}}\n")
    refused = cli("build", str(root / "job.yaml"), cwd=root)
    assert refused.returncode == 2, refused.stderr
    assert "notes.txt:2: GitHub token ghp_…" in refused.stderr and "sa.json:4: GCP service-account key" in refused.stderr
    assert registry.pushes(REPO_PATH) == 0

    put(root, ".ddpjobignore", "config/settings.py\nsa.json\ncluster.yaml\njobs/\n")
    put(root, "notes.txt", f"todo: rotate\nmy token {GITHUB} for the CI  # ddpjob: allow-secret\n")
    built = cli("build", str(root / "job.yaml"), cwd=root)
    assert built.returncode == 0, built.stderr
    assert registry.pushes(REPO_PATH) == 1
    listing, texts = image_files(built.stdout.strip())
    paths = {line.split()[2].removeprefix("/workspace/") for line in listing}
    assert {"train.py", "job.yaml", "notes.txt"} <= paths  # notes.txt: accepted on its line
    for gone in ("deploy_key", "certs/server.key", ".npmrc", "config/settings.py", "sa.json", "cluster.yaml",
                 "jobs/prod.yaml"):
        assert gone not in paths, gone
    assert "PRIVATE KEY" not in texts and "service_account" not in texts
