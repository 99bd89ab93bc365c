"""The content scan's speed-ups lose nothing (pure tier): the one-pass prefilter (``secretanchors``,
with ahocorasick_rs when installed; here a leftmost-first matcher in Python stands in for it, so the
same path runs everywhere) finds what the rule-by-rule scan finds, an anchor hidden by another's
match included; the cache of files scanned clean (``secretcache``) skips only unchanged content under
the same rules and scan version, and never a file with a finding.

Every secret-looking value here is made at run time by concatenation, so this file scans clean."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from test_build_content_scan import EXPECTED, GITHUB, KINDS, NOT_SECRETS, done_when_folder, put, shown

from launcher.service.imagebuild import context as buildctx
from launcher.service.imagebuild import secretanchors, secretcache, secretscan


class LeftmostFirst:
    """What ahocorasick_rs.BytesAhoCorasick(matchkind=LeftmostFirst) answers: non-overlapping
    matches, left to right; at a position, the first pattern in the list that matches there."""

    def __init__(self, patterns: tuple[bytes, ...], matchkind: object = None) -> None:
        self.patterns = patterns

    def find_matches_as_indexes(self, text: bytes) -> list[tuple[int, int, int]]:
        out, at = [], 0
        while True:
            best = None
            for k, p in enumerate(self.patterns):
                j = text.find(p, at)
                if j >= 0 and (best is None or j < best[1]):
                    best = (k, j, j + len(p))
            if best is None:
                return out
            out.append(best)
            at = best[2]


FAKE = types.SimpleNamespace(BytesAhoCorasick=LeftmostFirst, MatchKind=types.SimpleNamespace(LeftmostFirst=1))


CACHED = (secretanchors.anchors, secretscan._rules, secretcache.version)  # built for the matcher in use


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test starts and ends with the matcher installed here, its searches built anew."""
    for cached in CACHED:
        cached.cache_clear()
    yield
    for cached in CACHED:
        cached.cache_clear()


def use(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    """Find anchors with ``module`` (None: the pure-Python way)."""
    monkeypatch.setattr(secretanchors, "_ac", module)
    for cached in CACHED:
        cached.cache_clear()


@pytest.fixture
def one_pass(monkeypatch):
    use(monkeypatch, FAKE)
    assert secretanchors.matcher() == "ahocorasick_rs"


URL_PASSWORD = "pw-" + "x9Tq" + "7Lm2Zr"
# An anchor hidden by another's match: "users:" (a kubeconfig's) is found first and takes the ':' of "://".
HIDDEN = ("cfg.yaml", "db: users://admin:" + URL_PASSWORD + "@db.internal\n", "URL with a password")
TEXTS = [(name, text) for name, text, _ in KINDS] + NOT_SECRETS + [HIDDEN[:2]] + [
    ("mixed.py", f"# see https://example.org/a\nt = '{GITHUB}'\nu = 'https://me:{URL_PASSWORD}@h.example.org'\n"),
    ("plain.py", "def f(x):\n    return x + 1  # https://docs.python.org/3/\n"),
]


def findings(name: str, text: str) -> list[str]:
    return [f.shown() for f in secretscan.scan_text(name, text.encode())]


@pytest.mark.parametrize(("name", "text"), TEXTS, ids=[f"{i}-{n}" for i, (n, _) in enumerate(TEXTS)])
def test_the_one_pass_prefilter_finds_what_the_rule_by_rule_scan_finds(name, text, monkeypatch):
    use(monkeypatch, None)
    expected = findings(name, text)
    use(monkeypatch, FAKE)
    assert secretscan._rules(secretscan.rules_key(name))[1].one_pass
    assert findings(name, text) == expected


def test_an_anchor_hidden_by_another_match_is_looked_for_on_its_own(one_pass):
    name, text, kind = HIDDEN
    assert [f.kind for f in secretscan.scan_text(name, text.encode())] == [kind]
    search = secretscan._rules(secretscan.rules_key(name))[1]
    assert b"://" in search.overlaps[b"users:"]
    hits = search._search.find_matches_as_indexes(text.encode())  # type: ignore[union-attr]
    assert [search.anchors[i] for i, _, _ in hits] == [b"users:"]  # the one pass alone misses "://"
    search.overlaps = dict.fromkeys(search.anchors, ())
    assert secretscan.scan_text(name, text.encode()) == []  # ... and so would the scan, without the second look


def test_the_done_when_folder_gives_the_same_findings_both_ways(tmp_path, one_pass):
    root = done_when_folder(tmp_path)
    assert shown(buildctx.scan(root, cache=secretcache.CleanCache(None)).findings) == EXPECTED


def test_positions_are_every_occurrence():
    assert secretanchors.positions(b"a://b c://d ://", b"://") == [1, 7, 12]
    assert secretanchors.positions(b"nothing here", b"://") == []


@pytest.fixture
def counted(monkeypatch):
    """The files ``secretscan.scan_text`` was run on."""
    seen: list[str] = []
    real = secretscan.scan_text

    def scan_text(rel: str, text: bytes, key: str | None = None) -> list[secretscan.Finding]:
        seen.append(rel)
        return real(rel, text, key)

    monkeypatch.setattr(secretscan, "scan_text", scan_text)
    return seen


def test_a_rebuild_scans_only_what_changed_and_every_finding_again(tmp_path, counted, ddpjob_home):
    root = tmp_path / "ctx"
    put(root, "train.py", "print('train')\n")
    put(root, "conf/a.yaml", "lr: 0.1\n")
    put(root, "notes.txt", f"my token {GITHUB}\n")
    first = buildctx.scan(root)
    assert sorted(counted) == ["conf/a.yaml", "notes.txt", "train.py"]
    assert (ddpjob_home / "build" / "scanned-clean").is_file()
    counted.clear()
    again = buildctx.scan(root)
    assert counted == ["notes.txt"]  # a file with a finding is never remembered as clean
    assert [f.shown() for f in again.findings] == [f.shown() for f in first.findings] == ["notes.txt:1 GitHub token ghp_…"]
    counted.clear()
    put(root, "train.py", f"print('train')\nt = '{GITHUB}'\n")  # changed: scanned again, and found
    assert [f.where for f in buildctx.scan(root).findings] == ["notes.txt:1", "train.py:2"]
    assert sorted(counted) == ["notes.txt", "train.py"]
    counted.clear()
    assert [f.where for f in buildctx.scan(root, secrets=False).findings] == [] and counted == []


def test_clean_content_under_other_rules_is_scanned_again(tmp_path, counted):
    spec = "command: [x]\nenv:\n  DB_PASSWORD: " + "hunter" + "2-real-one\n"
    root = tmp_path / "ctx"
    put(root, "a.py", spec)  # code: the spec rule does not apply, so clean
    assert buildctx.scan(root).findings == []
    put(root, "b.yaml", spec)  # the same content where the spec rule applies
    counted.clear()
    assert [f.shown() for f in buildctx.scan(root).findings] == ["b.yaml:3 secret env value in a ddpjob spec hunt…"]
    assert counted == ["b.yaml"]


def test_a_cache_of_another_scan_version_or_unreadable_is_not_used(tmp_path, counted, monkeypatch):
    root = tmp_path / "ctx"
    put(root, "a.py", "x = 1\n")
    cache_file = tmp_path / "scanned-clean"
    buildctx.scan(root, cache=secretcache.CleanCache(cache_file))
    assert len(cache_file.read_text().splitlines()) == 2
    counted.clear()
    buildctx.scan(root, cache=secretcache.CleanCache(cache_file))
    assert counted == []
    monkeypatch.setattr(secretcache, "version", lambda: "another")  # a rule changed
    buildctx.scan(root, cache=secretcache.CleanCache(cache_file))
    assert counted == ["a.py"]
    assert cache_file.read_text().splitlines()[0] == f"{secretcache.FORMAT} another"  # started again
    counted.clear()
    cache_file.write_bytes(b"\xff\x00garbage")
    buildctx.scan(root, cache=secretcache.CleanCache(cache_file))
    assert counted == ["a.py"]


def test_the_scan_version_follows_the_rules_source(monkeypatch, tmp_path):
    before = secretcache.version()
    copy = tmp_path / "secretscan.py"
    copy.write_bytes(Path(str(secretscan.__file__)).read_bytes() + b"\n# a rule changed\n")
    monkeypatch.setattr(secretscan, "__file__", str(copy))
    secretcache.version.cache_clear()
    try:
        assert secretcache.version() != before
    finally:
        monkeypatch.undo()
        secretcache.version.cache_clear()
    assert secretcache.version() == before


def test_a_full_cache_starts_again_from_the_build_at_hand(tmp_path, counted, monkeypatch):
    cache_file = tmp_path / "scanned-clean"
    put(tmp_path / "x", "x.py", "x = 1\n")
    put(tmp_path / "y", "y1.py", "y = 1\n")
    put(tmp_path / "y", "y2.py", "y = 2\n")
    buildctx.scan(tmp_path / "x", cache=secretcache.CleanCache(cache_file))
    buildctx.scan(tmp_path / "y", cache=secretcache.CleanCache(cache_file))
    assert len(cache_file.read_text().splitlines()) == 4
    monkeypatch.setattr(secretcache, "MAX_ENTRIES", 2)
    put(tmp_path / "y", "y3.py", "y = 3\n")
    counted.clear()
    buildctx.scan(tmp_path / "y", cache=secretcache.CleanCache(cache_file))
    assert counted == ["y3.py"] and len(cache_file.read_text().splitlines()) == 4  # x.py's line dropped
    counted.clear()
    buildctx.scan(tmp_path / "y", cache=secretcache.CleanCache(cache_file))
    buildctx.scan(tmp_path / "x", cache=secretcache.CleanCache(cache_file))
    assert counted == ["x.py"]
