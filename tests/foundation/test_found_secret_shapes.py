"""Secrets by what they are, everywhere they could leave (issue 47 item 3): an env value that is a
credential by its shape (a GitHub token under the name ``GH``) is secret whatever its name, and what a
job prints of its secret values or of any credential is masked in status, list, logs and errors."""

from __future__ import annotations

import dataclasses
import json
import secrets
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.core.tokens import MASK, Marks, kind_of, mask_shapes, scrub
from launcher.spec.secrets import is_secret, marks_of, mask_env

GH = "ghp_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"  # the shape of a GitHub token, not a real one
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"
NPM = "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB\n-----END OPENSSH PRIVATE KEY-----"


@pytest.mark.parametrize("value, kind", [(GH, "GitHub token"), (HF, "Hugging Face token"), (NPM, "npm token"),
                                         (PEM, "private key"), ("AKIAIOSFODNN7EXAMPLA", "AWS access key id"),
                                         ("postgres://me:" + "s3cr3t@db.internal/x", "URL with a password")])
def test_a_credential_is_told_by_its_shape_and_its_name_does_not_matter(value, kind):
    assert kind_of(value) == kind
    assert is_secret("GH", value) and not is_secret("GH", "plain") and is_secret("DB_PASSWORD", "plain")
    assert mask_env({"X": value, "LR": "0.1"}) == {"X": MASK, "LR": "0.1"}
    assert value.split("\n")[0] not in mask_shapes(f"got {value} from the vault")


@pytest.mark.parametrize("value", ["ghp_short", "hf_lower", "AKIA", "https://example.com/a@b", "0.001",
                                   "/data/imagenet", "gh_" + "a" * 40, "user@example.com"])
def test_ordinary_values_are_not_taken_for_credentials(value):
    assert kind_of(value) is None and mask_shapes(value) == value


def test_marks_find_a_jobs_values_again_in_what_it_prints_without_keeping_them():
    marks = Marks.of(["hunter2hunter2", "pa$$w0rd!", "ab"])
    stored = json.dumps(marks.to_json())
    assert "hunter2" not in stored and "pa$$" not in stored and '"ab"' not in stored
    again = Marks.from_json(json.loads(stored))  # as the registry gives it back
    text = "pw=hunter2hunter2; (pa$$w0rd!) xhunter2hunter2 hunter2hunter2x ab"
    assert again.scrub(text) == "pw=***; (***) xhunter2hunter2 hunter2hunter2x ab"  # values, not parts of words
    assert Marks.of(["abc"]) is None  # too short to look for: "1" would mask half of every line
    assert scrub(f"token {GH} and hunter2hunter2", again) == "token *** and ***"
    assert Marks.from_json({"salt": 1}) is None and Marks.from_json(None) is None


def test_values_without_whitespace_are_looked_for_only_in_long_enough_stretches_and_found_as_before():
    """A job whose values hold no whitespace (``plain``) has only the text's stretches without
    whitespace at least as long as its shortest value searched: the same masks as searching every
    word of the text (a record of an older version, which does not say, is searched that way)."""
    plain = Marks.of(["hunter2hunter2", "pa$$w0rd!", "s3cr3t_v"])
    assert plain.plain and plain.to_json()["plain"] is True
    older = Marks.from_json({k: v for k, v in plain.to_json().items() if k != "plain"})
    assert older is not None and not older.plain
    texts = ["hunter2hunter2", " s3cr3t_v", "pw=hunter2hunter2;(pa$$w0rd!)", "x s3cr3t_v\ts3cr3t_vx s3cr3t_v",
             "[node0 rank1] step 5 loss 0.25 compute_ms=3.4 pa$$w0rd!pa$$w0rd! hunter2hunter2hunter2hunter2",
             "a" * 40 + " hunter2hunter2\n", "s3cr3t_v" * 3, "(s3cr3t_v)"]
    seen = [plain.scrub(t) for t in texts]
    assert seen == [older.scrub(t) for t in texts]
    assert seen[:4] == ["***", " ***", "pw=***;(***)", "x ***\ts3cr3t_vx ***"]
    assert seen[5].endswith(" ***\n") and seen[7] == "(***)"
    # A value with whitespace in it: the whole text is searched, as before.
    spaced = Marks.of(["correct horse battery", "hunter2hunter2"])
    assert spaced is not None and not spaced.plain
    assert spaced.scrub("pw: correct horse battery; hunter2hunter2") == "pw: ***; ***"


_VALUES = ["hunter2hunter2", "pa$$w0rd!", "s3cr3t_v", "_x=y_"]
_PIECES = st.sampled_from([*_VALUES, "hunter2", " ", "\t", "\n", "x", "_", "=", ";", "(", ")", "!", "$", "0.5", "loss",
                           "é", "密", "\u2003", "\u00a0", "\ud800"])
_PLAIN = Marks.of(_VALUES)


def _masked_as_defined(text: str, values: list[str]) -> str:
    """What masking means, written plainly: left to right, the longest value at a position that cuts no
    word (no word character just before it, and not one on both sides of its end) becomes ``***``."""
    def word(i: int) -> bool:
        return 0 <= i < len(text) and (text[i].isascii() and (text[i].isalnum() or text[i] == "_"))

    out, at = [], 0
    while at < len(text):
        here = [v for v in values if text.startswith(v, at) and not word(at - 1)
                and not (word(at + len(v) - 1) and word(at + len(v)))]
        if here:
            out.append(MASK)
            at += max(map(len, here))
        else:
            out.append(text[at])
            at += 1
    return "".join(out)


@given(st.lists(_PIECES, max_size=30).map("".join))
@settings(max_examples=300, deadline=None)
def test_the_values_are_masked_as_defined_whether_the_stretches_without_whitespace_or_every_word_is_searched(text):
    assert _PLAIN is not None and _PLAIN.plain
    expected = _masked_as_defined(text, _VALUES)
    assert _PLAIN.scrub(text) == expected
    assert dataclasses.replace(_PLAIN, plain=False).scrub(text) == expected  # a record of an older version


def test_the_marks_cover_secret_names_shapes_and_the_hosts_values():
    marks = marks_of({"DB_PASSWORD": "hunter2hunter2", "GH": GH, "LR": "0.100"}, {"HOST_TOKEN": "from-the-shell"})
    assert marks is not None and len(marks.marks) == 3
    assert marks.scrub("0.100 from-the-shell") == "0.100 ***"


def test_a_token_under_an_ordinary_name_is_masked_in_render_and_refused_on_kubernetes(cli, tmp_path):
    (tmp_path / "job.yaml").write_text(f"name: t\ncommand: [python, train.py]\nenv:\n  GH: {GH}\n  LR: '0.1'\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    shown = cli("render", "job.yaml", "--target", "local", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert GH not in shown.stdout and "GH='***'" in shown.stdout and "LR=0.1" in shown.stdout
    refused = cli("render", "job.yaml", "--target", "k8s", "--set", "image=img:1", cwd=tmp_path)
    assert refused.returncode == 2 and GH not in refused.stdout + refused.stderr
    assert "env.GH: GH holds a GitHub token: on Kubernetes its value would be written as plain text" in refused.stderr


def test_an_error_never_quotes_a_credential(cli, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    out = cli("submit", "--dry-run", "--target", "local", "--set", f"env.GH={GH}", "--set", f"env.X=[{HF}]",
              "--", "python", "train.py", cwd=tmp_path)
    assert out.returncode == 2, out.stdout
    assert GH not in out.stderr and HF not in out.stderr and "env.X" in out.stderr


PRINTS = """
import os, sys
print("token", os.environ["GH"], "password", os.environ["DB_PASSWORD"], flush=True)
sys.exit("cannot log in with " + os.environ["DB_PASSWORD"] + " or " + os.environ["GH"])
"""


@pytest.mark.real
def test_what_a_job_prints_of_its_secrets_is_masked_in_status_list_and_logs(cli, tmp_path, ddpjob_home):
    password = f"pw-{secrets.token_hex(6)}"
    (tmp_path / "prints.py").write_text(PRINTS)
    (tmp_path / "job.yaml").write_text(f"name: prints\ncommand: [python, prints.py]\nenv:\n  GH: {GH}\n"
                                       f"  DB_PASSWORD: {password}\n")
    job_id = cli("submit", "-q", "job.yaml", "--target", "local", cwd=tmp_path, check=True).stdout.strip()
    assert cli("wait", job_id, "--timeout", "120").returncode == 1
    raw = (ddpjob_home / "runs" / job_id / "task-0" / "node-0.log").read_text()
    assert password in raw and GH in raw  # the job did print them: the run folder keeps its own output
    shown = [cli("status", job_id), cli("status", job_id, "-o", "json"), cli("list"), cli("list", "-o", "json"),
             cli("logs", job_id), cli("logs", job_id, "-v")]
    for proc in shown:
        assert proc.returncode == 0, proc.stderr
        assert password not in proc.stdout and GH not in proc.stdout, proc.args
    status = shown[0].stdout
    assert "cannot log in with *** or ***" in status, status
    assert "token *** password ***" in shown[4].stdout
    with sqlite3.connect(ddpjob_home / "registry.db") as db:
        rows = " ".join(str(r) for r in db.execute("SELECT * FROM jobs"))
    assert password not in rows and GH not in rows and "cannot log in with ***" in rows  # notify sends this message
