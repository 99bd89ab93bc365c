"""Secrets told by what a file holds, not by its name: the content scan of a build context.

``context.scan`` hands each file's pieces to a ``FileScan`` as it hashes them (one read of each
file, no second pass); what it finds (``Finding``: path, line, kind, the value masked) stops the
build unless the user leaves the file out (``.ddpjobignore``) or accepts it (an allow comment on the
line, ``# ddpjob: allow-secret`` or detect-secrets' ``pragma: allowlist secret``, or
``build.allow_secrets`` in the spec). Files over ``MAX_SCANNED`` bytes and binary files (a NUL byte
in their first 8000 bytes, git's rule) are not scanned, and the build says so.

The patterns are the published ones of two maintained detectors, named beside each rule:
detect-secrets (Yelp, its plugins: ``AWSKeyDetector``, ``PrivateKeyDetector``, ...) and gitleaks
(its rule ids: ``aws-access-token``, ``github-pat``, ...). detect-secrets 1.5.0 itself is not a
dependency: it reads each file itself (a second read), runs every plugin over every line in Python
(pydantic's 4.3 MB of sources: 3.5 s, with 4 false alarms, against 0.02 s and none here), and pulls in
requests (0.5 s to import its scanner). Each kind is looked for only in a file holding one of its
anchors (``Rule.needs``: literals each finding of it holds), found for all rules in one pass where
ahocorasick_rs is installed (``secretanchors``), else gate by gate (a C-speed ``in`` test each); files
scanned clean before are not scanned again (``secretcache``, by content).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from launcher.core import tokens
from launcher.service.imagebuild import secretanchors

MAX_SCANNED = 10 << 20  # bytes; larger files are data, not code or configuration
TOO_LARGE = f"over {MAX_SCANNED >> 20} MiB"
BINARY_PROBE = 8000  # git's own rule: a NUL byte in the first 8000 bytes makes a file binary
# Numeric data (CSV of numbers, logs of losses) is told in one pass over it (``bytes.translate``) rather
# than one pass per kind; only for files this large, where it pays.
NUMBERS, NUMBERS_FROM = b"0123456789 \t\r\n,.;:+-eE\"'|[]()", 1 << 20
ALLOW_MARKS = (b"ddpjob: allow-secret", b"pragma: allowlist secret")
ALLOW_NEXT_MARKS = (b"ddpjob: allow-secret-next-line", b"pragma: allowlist nextline secret")
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".conf", ".tfvars", ".tf", ".properties",
                   ".env", ".txt", ".netrc", ".npmrc", ".pypirc", ".git-credentials", "config", "settings", ".bak",
                   ".old", ".orig")
# Values a document writes where a real one would go: never reported.
PLACEHOLDERS = re.compile(rb"(?i)^(?:x+|\*+|\.+|-+|<.*>|\{.*\}|\$.*|%.*|.*example.*|.*changeme.*|pass(?:word|wd)?|"
                          rb"secret|pwd|token|user|username|none|null|true|false|test|dummy|fake|foo|bar|redacted|"
                          rb"your[-_a-z]*|my[-_a-z]*)$")


@dataclass(frozen=True)
class Finding:
    """A secret-looking value at a line of a file that would go into the image."""

    rel: str
    line: int
    kind: str
    masked: str

    @property
    def where(self) -> str:
        return f"{self.rel}:{self.line}"

    def shown(self) -> str:
        """``file:line kind value-masked``, how a finding is named everywhere."""
        return f"{self.where} {self.kind} {self.masked}"


def mask(value: bytes) -> str:
    """At most the first 4 characters, then ``…``."""
    text = value.decode("utf-8", "replace")
    return text[:4] + "…"


@dataclass(frozen=True)
class Rule:
    kind: str
    gate: tuple[bytes, ...]  # the rule runs only on a piece holding one of these
    find: Callable[[bytes], Iterator[tuple[int, bytes]]]  # (offset, value) of each finding in a piece
    # Without a gate: literals one of which every finding holds, for the one-pass prefilter
    # (``secretanchors``); the pure-Python way runs such a rule's own expression on every piece.
    anchors: tuple[bytes, ...] = ()
    # For an expression that starts with its one anchor: its findings, given where the anchor starts.
    at: Callable[[bytes, list[int]], Iterator[tuple[int, bytes]]] | None = None

    @property
    def needs(self) -> tuple[bytes, ...]:
        return self.gate or self.anchors


def _regex(pattern: bytes, group: int = 0, keep: Callable[[re.Match[bytes]], bool] | None = None,
           ) -> Callable[[bytes], Iterator[tuple[int, bytes]]]:
    expression = re.compile(pattern)

    def find(text: bytes) -> Iterator[tuple[int, bytes]]:
        for m in expression.finditer(text):
            if keep is None or keep(m):
                yield m.start(group), m.group(group)
    return find


def _glued(text: bytes, start: int) -> bool:
    """Whether the character before ``start`` makes the match part of a longer word."""
    return start > 0 and (text[start - 1:start].isalnum() or text[start - 1:start] == b"_")


_WORDS = re.compile(rb"^[A-Za-z_]+$|^\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _config_value(m: re.Match[bytes]) -> bool:
    """A value a password could be: not a placeholder, not letters alone (``FAKE_SECRET``, a name)
    and not a dotted name (``self.password``, ``.models.v1_secret``): code in a config's clothes."""
    return _real(m) and not _WORDS.match(m.group(1))


def _real(m: re.Match[bytes], group: int = 1) -> bool:
    value = m.group(group).strip(b"'\"")
    return len(value) >= 6 and not PLACEHOLDERS.match(value)


# AWS: the key id (gitleaks aws-access-token, detect-secrets AWSKeyDetector) counts only with a
# secret access key nearby (40 base64 characters within 5 lines), so a documented id alone does not.
_AWS_ID = re.compile(rb"((?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16})(?![A-Za-z0-9])")
_AWS_SECRET = re.compile(rb"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def _aws(text: bytes) -> Iterator[tuple[int, bytes]]:
    for m in _AWS_ID.finditer(text):
        if b"EXAMPLE" in m.group(1) or _glued(text, m.start(1)):
            continue
        lo = _line_start(text, m.start(), back=5)
        hi = _line_end(text, m.end(), ahead=5)
        if any(re.search(rb"[0-9]", s.group()) and re.search(rb"[A-Z]", s.group()) and re.search(rb"[a-z]", s.group())
               for s in _AWS_SECRET.finditer(text, lo, hi)):
            yield m.start(1), m.group(1)


def _line_start(text: bytes, pos: int, back: int) -> int:
    for _ in range(back + 1):
        pos = text.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1


def _line_end(text: bytes, pos: int, ahead: int) -> int:
    for _ in range(ahead + 1):
        nxt = text.find(b"\n", pos + 1)
        if nxt < 0:
            return len(text)
        pos = nxt
    return pos


# GCP service-account key JSON (gitleaks gcp-service-account): the type and its private key.
_GCP_KEY = re.compile(rb'"private_key"\s*:\s*"(-----BEGIN[^"]{64,})"')


def _gcp(text: bytes) -> Iterator[tuple[int, bytes]]:
    if re.search(rb'"type"\s*:\s*"service_account"', text):
        for m in _GCP_KEY.finditer(text):
            yield m.start(1), m.group(1)


# kubeconfig (gitleaks kubernetes-secret-yaml's neighbour; detect-secrets KeywordDetector's yaml keys):
# a user's credentials under ``users:`` in a document of ``kind: Config``.
_KUBE_CRED = re.compile(rb"(?m)^[ \t-]*(token|client-key-data|password):[ \t]*['\"]?([^\s'\"#]+)")


def _kubeconfig(text: bytes) -> Iterator[tuple[int, bytes]]:
    if not re.search(rb"(?m)^kind:\s*['\"]?Config\b", text):
        return
    users = re.search(rb"(?m)^users:", text)
    if users is None:
        return
    end = re.compile(rb"(?m)^[A-Za-z]").search(text, users.end())
    for m in _KUBE_CRED.finditer(text, users.end(), end.start() if end else len(text)):
        if m.group(1) != b"password" or _real(m, 2):
            yield m.start(2), m.group(2)


# .git-credentials and any URL with a password (detect-secrets BasicAuthDetector): matched where each
# "://" starts (a match holds no other "://"), so files full of plain URLs cost no second pass.
_URL = re.compile(rb"://[^\s:/@'\"<>(){}\[\],]{1,100}:([^\s/@'\"<>(){}\[\],]{1,200})@[A-Za-z0-9.-]+")


def _url_at(text: bytes, starts: list[int]) -> Iterator[tuple[int, bytes]]:
    match = _URL.match
    for m in [m for start in starts if (m := match(text, start)) is not None]:
        if _real(m):
            yield m.start(1), m.group(1)


_SHAPED = tuple(Rule(shape.kind, tuple(g.encode() for g in shape.gate), _regex(shape.source.encode(), 1))
                for shape in tokens.SHAPES if shape.kind in tokens.SHAPED_ALONE)
_RULES: tuple[Rule, ...] = (  # in this order: the first to find something on a line names it
    Rule("GCP service-account key", (b"PRIVATE KEY",), _gcp),
    # detect-secrets PrivateKeyDetector's markers, gitleaks private-key's shape (a body and an END line):
    # PEM (RSA, EC, DSA, PKCS#8, ENCRYPTED), OpenSSH and PGP private keys.
    Rule("private key", (b"PRIVATE KEY",), _regex(
        rb"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----(?:\\n|\s)[\s\S]{64,}?-----END[ A-Z0-9_-]{0,100}"
        rb"PRIVATE KEY(?: BLOCK)?-----")),
    Rule("AWS access key pair", (), _aws, (b"A3T", b"AKIA", b"ASIA", b"ABIA", b"ACCA")),  # ``_AWS_ID``'s
    # The credentials whose shape alone tells them (Azure storage keys; GitHub, GitLab, Slack, npm, PyPI and
    # Hugging Face tokens): the patterns every part of ddpjob masks them by (``core.tokens.SHAPES``).
    *_SHAPED,
    Rule("URL with a password", (), _regex(_URL.pattern, 1, _real), (b"://",), _url_at),
    # W&B API keys (40 hex characters) in a netrc for api.wandb.ai, wandb's settings or an env line.
    Rule("W&B API key", (b"wandb", b"WANDB"), _regex(
        rb"(?i)(?:wandb_api_key|api_key|machine\s+api\.wandb\.ai[\s\S]{0,200}?password)\s*[=:\s]\s*['\"]?([0-9a-f]{40})\b", 1)),
)
# In files named as configuration is (``config_like``), the shapes of the login files (their own names
# are left out by ``secretfiles``; these catch copies and renamed ones) and a password or secret
# written as a value (detect-secrets KeywordDetector, gitleaks generic-api-key's keywords). Code is left
# to the rules above: its literals are tests and examples, and each rule here costs a pass over it.
_CONFIG_RULES: tuple[Rule, ...] = (  # in this order: the first to find something on a line names it
    Rule("GCP service-account key", (b"PRIVATE KEY",), _gcp),
    Rule("kubeconfig credentials", (b"users:",), _kubeconfig),
    # .netrc's shape (detect-secrets KeywordDetector's netrc case): machine HOST login USER password PASS.
    Rule("netrc password", (b"machine",), _regex(
        rb"\bmachine\s+\S+\s+(?:login\s+\S+\s+)?password\s+(\S+)", 1, _real)),
    # .npmrc (detect-secrets NpmDetector): //registry/:_authToken=..., _auth=..., _password=...
    Rule("npm registry login", (b"_auth", b"_password"), _regex(
        rb"(?m)(?:^|:)_(?:authToken|auth|password)\s*=\s*['\"]?([^\s'\"]+)", 1, _real)),
    # .pypirc (detect-secrets KeywordDetector): a password line in an index's section.
    Rule("package index password", (b"[pypi]", b"[distutils]", b"repository"), _regex(
        rb"(?m)^\s*password\s*[:=]\s*(\S+)", 1, _real)),
    Rule("password or secret in configuration", (b"assw", b"ecret", b"ASSW", b"ECRET"), _regex(
        rb"(?im)^[ \t]*[\"']?[A-Za-z0-9_.-]*(?:password|passwd|secret)(?:[_.-]?(?:key|value))?[\"']?[ \t]*[:=][ \t]*"
        rb"[\"']?([^\s\"'#,()\[\]{}]{8,})(?=[\s\"',]|$)", 1, _config_value)),
)


@dataclass
class FileScan:
    """The scan of one file, fed the pieces ``context._read`` reads; ``findings`` once ``done``."""

    rel: str
    parts: list[bytes] | None = None  # the file's pieces so far, when scanned (at most MAX_SCANNED)
    skipped: str = ""  # why it is not scanned: "binary" or "over 10.0 MiB"
    size: int = 0  # the file's size as listed

    def feed(self, chunk: bytes) -> None:
        if self.skipped:
            return
        if self.parts is None:
            if chunk.find(b"\0", 0, BINARY_PROBE) >= 0:
                self.skipped = "binary"
                return
            self.parts = []
        self.parts.append(chunk)

    @property
    def key(self) -> str:
        return rules_key(self.rel)

    def done(self, key: str | None = None) -> list[Finding]:
        """The findings (``key``: the file's ``rules_key`` where already known)."""
        if self.skipped or not self.parts:
            return []
        return scan_text(self.rel, self.parts[0] if len(self.parts) == 1 else b"".join(self.parts), key)


def start(rel: str, size: int) -> FileScan:
    """The scan of a file of ``size`` bytes (one too large is skipped, never held in memory)."""
    return FileScan(rel, skipped=TOO_LARGE if size > MAX_SCANNED else "", size=size)


def config_like(name: str) -> bool:
    """Whether a file of this (lowercase) name holds configuration: a dot file, a name without a
    suffix (netrc, settings, credentials), or one of ``CONFIG_SUFFIXES``."""
    return name.startswith(".") or "." not in name or name.endswith(CONFIG_SUFFIXES)


@functools.lru_cache(maxsize=1)
def _spec_rule() -> Rule:
    return Rule("secret env value in a ddpjob spec", (b"env:",), _spec_values)


def rules_key(rel: str) -> str:
    """Which rules a file of this path gets: "0" code, "1" configuration, "2" a YAML file (also the
    ddpjob spec's rule); a clean scan is remembered under it (``secretcache``)."""
    name = rel.rsplit("/", 1)[-1].lower()
    return "2" if name.endswith((".yaml", ".yml")) else "1" if config_like(name) else "0"


@functools.lru_cache(maxsize=4)
def _rules(key: str) -> tuple[tuple[Rule, ...], secretanchors.Anchors, dict[bytes, frozenset[int]]]:
    """The rules of ``rules_key`` ``key`` in order, their anchors' search, and anchor -> the rules it lets run."""
    rules = {"0": _RULES, "1": _RULES + _CONFIG_RULES, "2": (_spec_rule(), *_RULES, *_CONFIG_RULES)}[key]
    assert all(r.needs for r in rules), "each rule needs an anchor, or the prefilter would skip it"
    by_anchor: dict[bytes, frozenset[int]] = {}
    for i, rule in enumerate(rules):
        for a in rule.needs:
            by_anchor[a] = by_anchor.get(a, frozenset()) | {i}
    return rules, secretanchors.anchors(tuple(by_anchor), tuple(r.needs[0] for r in rules if r.at)), by_anchor


def scan_text(rel: str, text: bytes, key: str | None = None) -> list[Finding]:
    """Every finding in the file ``rel`` whose whole content is ``text``, accepted ones left out.
    A rule runs only where one of its anchors is: all found in one pass (``secretanchors``), or
    gate by gate, each literal tested once, in the pure-Python way. ``key``: ``rules_key(rel)``."""
    rules, search, by_anchor = _rules(key or rules_key(rel))
    found: dict[bytes, list[int]] | None = None
    if search.one_pass:
        found = search.found(text)
        if not found:
            return []
        run = [rules[i] for i in sorted(frozenset().union(*(by_anchor[a] for a in found)))]
    elif len(text) > NUMBERS_FROM and len(text.translate(None, NUMBERS)) < 16:
        return []  # a table of numbers: no kind here can be written with fewer than 16 other characters
    else:
        tested: dict[bytes, bool] = {}
        run = [r for r in rules if not r.gate or any(
            tested[g] if g in tested else tested.setdefault(g, g in text) for g in r.gate)]
    out: dict[int, Finding] = {}
    for rule in run:
        if rule.at is not None:
            anchor = rule.needs[0]
            hits = rule.at(text, found[anchor] if found is not None else secretanchors.positions(text, anchor))
        else:
            hits = rule.find(text)
        for offset, value in hits:
            line = text.count(b"\n", 0, offset) + 1
            if line not in out and not _allowed(text, offset):
                out[line] = Finding(rel, line, rule.kind, mask(value))
    return [out[n] for n in sorted(out)]


def _allowed(text: bytes, offset: int) -> bool:
    """An allow comment on the finding's line, or an allow-next-line comment on the line before."""
    start = text.rfind(b"\n", 0, offset) + 1
    end = text.find(b"\n", offset)
    line = text[start:end if end >= 0 else len(text)]
    if any(m in line for m in ALLOW_MARKS):
        return True
    before = text[text.rfind(b"\n", 0, max(start - 1, 0)) + 1:max(start - 1, 0)]
    return any(m in before for m in ALLOW_NEXT_MARKS)


def _spec_values(text: bytes) -> Iterator[tuple[int, bytes]]:
    """A ddpjob job spec (a ``command:`` and an ``env:`` mapping) with a secret env value written
    out, by ``launcher.spec.secrets``'s rule (the one that keeps it out of a PyTorchJob)."""
    if not re.search(rb"(?m)^command:", text):
        return
    from launcher.spec.secrets import is_secret

    block = re.search(rb"(?m)^env:[ \t]*(\{.*\})?[ \t]*$", text)
    if block is None:
        return
    if block.group(1):  # env: {A: 1, DB_PASSWORD: x}
        for m in re.finditer(rb"([A-Za-z_][A-Za-z0-9_]*)\s*:\s*('[^']*'|\"[^\"]*\"|[^,}\s]+)", block.group(1)):
            if is_secret(m.group(1).decode()) and m.group(2).strip(b"'\""):
                yield block.start(1) + m.start(2), m.group(2).strip(b"'\"")
        return
    end = _ENV_END.search(text, block.end())  # the next line at the margin ends the env: mapping
    for m in _ENV_ITEM.finditer(text, block.end(), end.start() if end else len(text)):
        value = m.group(2).split(b" #")[0].strip().strip(b"'\"")
        if is_secret(m.group(1).decode()) and value:
            yield m.start(2), value


_ENV_END = re.compile(rb"(?m)^[^\s#]")
_ENV_ITEM = re.compile(rb"(?m)^[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*:[ \t]*(\S.*)$")
