"""A secret-named ``env:`` value is refused before anything reaches the API server: it would be
stored as plain ``value:`` in the PyTorchJob/TrainJob, readable by anyone who may read the job."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_submit_refuses_a_secret_env_value_and_sends_nothing(k8s_api, cli, tmp_path, api):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nimage: img:1\ncommand: [python, x.py]\nenv: {API_TOKEN: tok-Hunter2pw}\n")
    proc = cli("submit", str(spec), "-t", "k8s", "--set", f"k8s.api={api}", "--no-preflight")
    assert proc.returncode == 2 and "k8s.env_refs" in proc.stderr and f"{spec}:4:" in proc.stderr, proc.stderr
    assert "Hunter2pw" not in proc.stdout + proc.stderr
    assert not [r for r in k8s_api.server.requests if r["method"] != "GET"]
    assert "Hunter2pw" not in json.dumps(k8s_api.server.requests)
    assert cli("list", "-o", "json").stdout.strip() in ("[]", "")
