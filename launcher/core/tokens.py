"""Secrets told by what they are: the shapes of credentials that say so themselves, and a job's own
secret values found again in text without keeping them.

``SHAPES`` are the published patterns of two maintained detectors (detect-secrets' plugins and
gitleaks' rule ids, named beside each): a private-key block, a GitHub, GitLab, Slack, npm, PyPI or
Hugging Face token, an AWS access key id, an Azure storage key, the password of a URL. Each is a
value that is a secret wherever it is written, so:

- ``kind_of(value)``: an env value of one of these shapes is secret whatever its name
  (``launcher.spec.secrets.is_secret``): masked in a plan, the registry, ``render``, refused in a
  PyTorchJob as a secret-named one is;
- ``mask_shapes(text)``: text that ddpjob shows or sends from a job (a status message, a root cause,
  a log line, a notification) has them replaced by ``***``.

A value with no shape of its own (``DB_PASSWORD: hunter2hunter2``) is found again by ``Marks``: at
submit ddpjob keeps, per job, a random salt and the salted SHA-256 of each secret value (with its
length), never the value; ``Marks.scrub(text)`` hashes the text's words of those lengths and masks
those that match. It also keeps whether every value is free of whitespace (``plain``): then only the
text's stretches without whitespace are searched, and a log line's short words cost no hash
(``tests/bench/scrub_bench.py``). The build's content scan (``service/imagebuild/secretscan``) looks
for the same kinds in a build context's files, with the context rules a whole file allows (an AWS key
id only beside its secret key, kubeconfig and login files' layouts).

Standard library only (``launcher.core``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import hashlib

MASK = "***"
MIN_MARKED = 4  # shorter values are not looked for in text: "1" or "yes" would mask half of every line


@dataclass(frozen=True)
class Shape:
    kind: str
    gate: tuple[str, ...]  # the shape is looked for only in text holding one of these (C-speed ``in`` tests)
    source: str  # the expression; group 1: what is masked

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.source)


@functools.cache
def _compiled(source: str) -> re.Pattern[str]:  # on first use: most commands never need one
    return re.compile(source)


SHAPES: tuple[Shape, ...] = (
    # detect-secrets PrivateKeyDetector's markers, gitleaks private-key: the block to its END line (or
    # to the end of the text, when it is cut): PEM (RSA, EC, DSA, PKCS#8, ENCRYPTED), OpenSSH, PGP.
    Shape("private key", ("PRIVATE KEY",),
          r"(-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END[ A-Z0-9_-]{0,100}"
          r"PRIVATE KEY(?: BLOCK)?-----|[\s\S]*))"),
    # gitleaks github-pat / github-oauth / github-app-token / github-refresh-token; detect-secrets GitHubTokenDetector.
    Shape("GitHub token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
          r"(?<![0-9A-Za-z_])(gh[pousr]_[0-9A-Za-z]{36,255})(?![0-9A-Za-z])"),
    Shape("GitHub token", ("github_pat_",), r"\b(github_pat_[0-9A-Za-z_]{82})\b"),  # github-fine-grained-pat
    Shape("GitLab token", ("glpat-",), r"\b(glpat-[0-9A-Za-z_-]{20,})"),  # gitlab-pat, GitLabTokenDetector
    # detect-secrets SlackDetector; gitleaks slack-bot-token / slack-user-token / slack-app-token.
    Shape("Slack token", ("xox",), r"\b(xox[baprs]-(?:[0-9]+-)+[0-9A-Za-z]{8,})"),
    Shape("npm token", ("npm_",), r"\b(npm_[A-Za-z0-9]{36})\b"),  # npm-access-token, NpmDetector
    Shape("PyPI token", ("pypi-AgEI",), r"(pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,})"),  # pypi-upload-token
    Shape("Hugging Face token", ("hf_",), r"\b(hf_[A-Za-z]{34})\b"),  # huggingface-access-token
    # gitleaks aws-access-token, detect-secrets AWSKeyDetector (the id; its secret key has no shape of its own).
    Shape("AWS access key id", ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
          r"(?<![A-Za-z0-9])((?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16})(?![A-Za-z0-9])"),
    Shape("Azure storage key", ("AccountKey",), r"AccountKey\s*=\s*([A-Za-z0-9+/=]{86,88})"),  # AzureStorageKeyDetector
    # detect-secrets BasicAuthDetector: scheme://user:PASSWORD@host.
    Shape("URL with a password", ("://",),
          r"://[^\s:/@'\"<>(){}\[\],]{1,100}:([^\s/@'\"<>(){}\[\],]{1,200})@[A-Za-z0-9.-]+"),
)

# The kinds a build context's file holds wherever they are written (``service/imagebuild/secretscan`` uses
# these shapes as they are; it tells the others with what a whole file says around them: an AWS key id
# only beside its secret key, a private key with its body, a URL's password that is not a placeholder).
SHAPED_ALONE = frozenset({"GitHub token", "GitLab token", "Slack token", "npm token", "PyPI token", "Hugging Face token",
                          "Azure storage key"})


def kind_of(value: str) -> str | None:
    """The kind of credential ``value`` holds (``"GitHub token"``), or None when it has no such shape."""
    for shape in SHAPES:
        if any(g in value for g in shape.gate) and shape.pattern.search(value):
            return shape.kind
    return None


def mask_shapes(text: str) -> str:
    """``text`` with every credential of a known shape replaced by ``***`` (a URL keeps its user
    and host: ``https://me:***@host``)."""
    if not _any_gate().search(text):  # one scan for every shape's gate: most lines hold none
        return text
    for shape in SHAPES:
        if any(g in text for g in shape.gate) and shape.pattern.search(text):
            text = shape.pattern.sub(_masked_group, text)
    return text


@functools.cache
def _any_gate() -> re.Pattern[str]:
    return re.compile("|".join(re.escape(g) for shape in SHAPES for g in shape.gate))


def _masked_group(m: re.Match[str]) -> str:
    whole, (start, end) = m.group(0), m.span(1)
    return whole[:start - m.start()] + MASK + whole[end - m.start():]


@dataclass(frozen=True)
class Marks:
    """A job's secret values as ddpjob keeps them: a salt and, per value, its length and salted
    SHA-256 (hex). Enough to find a value again in text; not enough to read it back."""

    salt: str
    marks: frozenset[tuple[int, str]]
    plain: bool = False  # no value holds whitespace (a record of an older version does not say: False)

    @classmethod
    def of(cls, values: list[str]) -> Marks | None:
        """The marks of ``values`` (those of at least ``MIN_MARKED`` characters), or None when none is."""
        kept = sorted({v for v in values if len(v) >= MIN_MARKED})
        if not kept:
            return None
        import secrets

        salt = secrets.token_hex(16)
        hasher = _salted(salt)
        return cls(salt, frozenset((len(v), _digest(hasher, v)) for v in kept),
                   plain=not any(_SPACE.search(v) for v in kept))

    def to_json(self) -> dict[str, object]:
        return {"salt": self.salt, "marks": sorted([n, h] for n, h in self.marks), "plain": self.plain}

    @classmethod
    def from_json(cls, data: object) -> Marks | None:
        """The marks a record keeps; None for a record without any (or one this version cannot read)."""
        if not isinstance(data, dict) or not isinstance(data.get("salt"), str) or not isinstance(data.get("marks"), list):
            return None
        marks = frozenset((int(m[0]), str(m[1])) for m in data["marks"]
                          if isinstance(m, list) and len(m) == 2 and isinstance(m[0], int) and isinstance(m[1], str))
        return cls(data["salt"], marks, plain=data.get("plain") is True) if marks else None

    @functools.cached_property
    def _lengths(self) -> list[int]:  # the values' lengths, longest first
        return sorted({n for n, _ in self.marks}, reverse=True)

    @functools.cached_property
    def _hasher(self) -> hashlib._Hash:
        return _salted(self.salt)

    def scrub(self, text: str) -> str:
        """``text`` with each of the job's secret values that starts a word replaced by ``***``."""
        lengths = self._lengths
        if not text or len(text) < lengths[-1]:
            return text
        # Where a value may lie, as bit masks over the text's positions (bit i: position i, the text's
        # end included), so that the stretches to hash are told apart in C, not a position at a time:
        # a value starts where no word character comes before and ends where a word character is not
        # on both sides (it cuts no word); a job whose values hold no whitespace (``plain``) looks only
        # at stretches without whitespace, which a log line's short words cannot hold.
        full = (1 << (len(text) + 1)) - 1
        raw = text.encode("latin-1", "replace")  # a byte a character: any other is "?", neither word nor space
        word_bits, solid_bits = _bit_tables()
        word = _mask(raw, word_bits)
        starts = ~(word << 1) & full
        ends = starts | (~word & full)
        solid = _mask(raw, solid_bits) if self.plain else 0
        found: dict[int, int] = {}  # start -> length of a value there (the longest)
        for n in lengths:
            at_n = starts & (ends >> n)
            if self.plain:
                at_n &= _runs(solid, n)
            bits = format(at_n, "b")[::-1]  # bit i: character i
            at = bits.find("1")
            while at >= 0:
                if at not in found and (n, _digest(self._hasher, text[at:at + n])) in self.marks:
                    found[at] = n
                at = bits.find("1", at + 1)
        if not found:
            return text
        out, last = [], 0
        for at in sorted(found):
            if at >= last:
                out.append(text[last:at] + MASK)
                last = at + found[at]
        return "".join(out) + text[last:] if out else text


_SPACE = re.compile(r"\s")


@functools.cache
def _bit_tables() -> tuple[bytes, bytes]:
    """Per byte of latin-1, "1" or "0": a word character (the ASCII ones, as the masks' words are); a
    character that is not whitespace. Built on first use: most commands never scrub."""
    word = bytes(b"01"[chr(i).isascii() and (chr(i).isalnum() or chr(i) == "_")] for i in range(256))
    return word, bytes(b"01"[not _SPACE.match(chr(i))] for i in range(256))


def _mask(raw: bytes, bits: bytes) -> int:
    """Bit i set where byte i of ``raw`` is "1" in the table ``bits``."""
    return int(raw.translate(bits)[::-1], 2)


def _runs(solid: int, n: int) -> int:
    """Bit i set where the ``n`` bits from i of ``solid`` are all set."""
    for step in _doubling(n):
        solid &= solid >> step
    return solid


@functools.cache
def _doubling(n: int) -> tuple[int, ...]:
    """The shifts that AND ``n`` bits together in log2(n) steps: 1, 2, 4, ..., then what is left."""
    steps, have = [], 1
    while have < n:
        steps.append(min(have, n - have))
        have += steps[-1]
    return tuple(steps)


def _salted(salt: str) -> hashlib._Hash:
    """SHA-256 that has read the salt: each value's digest continues a copy of it."""
    import hashlib  # here, not at the top: most commands never hash (an import done is a dict lookup)

    return hashlib.sha256((salt + "\0").encode("utf-8"))


def _digest(salted: hashlib._Hash, value: str) -> str:
    h = salted.copy()
    h.update(value.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def scrub(text: str, marks: Marks | None) -> str:
    """What ddpjob shows of ``text`` that came from a job: its secret values (``marks``) and every
    credential of a known shape masked."""
    if marks is not None:
        text = marks.scrub(text)
    return mask_shapes(text)
