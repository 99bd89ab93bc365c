"""Files left out of every build context as secret-looking, whatever the ignore file says.

An image is readable by everyone who can pull it, so what commonly holds a password, a token or a
key stays out by default: env files, private keys, cloud, cluster and registry logins
(``SECRET_FILES``, by name at any depth), any file that begins as a private key does (by its first
bytes), and the files given to ``--env-file`` (``context.scan``). A user who wants one in takes it
back with a ``!`` line in the ignore file that names the path itself, or a path inside a
secret-looking folder: a ``!`` line for a folder above it (``!config``) is not enough, so a broad
``*`` / ``!src`` pair never lets ``src/.env`` in by accident.
"""

from __future__ import annotations

import functools
import re

from launcher.service.imagebuild.ignores import Rule, prefixes, translate

ENV, KEY, CLOUD, CLUSTER, LOGIN, TOKEN = ("env file", "private key", "cloud credentials", "kubeconfig",
                                          "registry or package login", "token or password file")
# (pattern in .dockerignore syntax, matched at any depth; a trailing / matches folders, the rest
# files and links; why it looks secret)
SECRET_FILES: tuple[tuple[str, str], ...] = (
    # What dotenv, direnv and --env-file read.
    (".env", ENV), (".env.*", ENV), ("*.env", ENV), (".envrc", ENV),
    # Private keys and the stores that hold them.
    ("id_rsa", KEY), ("id_dsa", KEY), ("id_ecdsa", KEY), ("id_ed25519", KEY), ("id_ecdsa_sk", KEY),
    ("id_ed25519_sk", KEY), ("*.pem", KEY), ("*.key", KEY), ("*.p12", KEY), ("*.pfx", KEY), ("*.p8", KEY),
    ("*.ppk", KEY), ("*.jks", KEY), ("*.keystore", KEY), ("*.keytab", KEY), ("*.kdbx", KEY), (".ssh/", KEY),
    (".gnupg/", KEY),
    # Cloud accounts (a training folder that is a home folder, or a copy of one, holds these).
    (".aws/", CLOUD), (".azure/", CLOUD), (".config/gcloud/", CLOUD), (".oci/", CLOUD),
    ("application_default_credentials.json", CLOUD), ("credentials.json", CLOUD), ("client_secret*.json", CLOUD),
    (".boto", CLOUD), (".s3cfg", CLOUD), (".passwd-s3fs", CLOUD), (".databrickscfg", CLOUD), ("rclone.conf", CLOUD),
    ("*.tfstate", CLOUD), ("*.tfstate.backup", CLOUD), (".terraform.d/credentials.tfrc.json", CLOUD),
    # Clusters.
    (".kube/", CLUSTER), ("kubeconfig", CLUSTER), ("kubeconfig.*", CLUSTER), ("*.kubeconfig", CLUSTER),
    # Registries, package indexes and git hosts (wandb login writes its key to .netrc).
    (".docker/config.json", LOGIN), (".netrc", LOGIN), ("_netrc", LOGIN), (".pypirc", LOGIN),
    (".git-credentials", LOGIN), (".npmrc", LOGIN), (".cargo/credentials", LOGIN),
    (".cargo/credentials.toml", LOGIN), (".gem/credentials", LOGIN), (".config/gh/hosts.yml", LOGIN),
    # Tokens and passwords of the tools a training job meets.
    ("*huggingface/token", TOKEN), ("*huggingface/stored_tokens", TOKEN), (".kaggle/", TOKEN),
    ("kaggle.json", TOKEN), (".vault-token", TOKEN), (".pgpass", TOKEN), (".my.cnf", TOKEN), (".htpasswd", TOKEN),
    ("secrets.yaml", TOKEN), ("secrets.yml", TOKEN), ("secrets.json", TOKEN), ("secrets.toml", TOKEN),
)
ENV_FILE_WHY = "given to --env-file"
HEAD_BYTES = 256  # what ``by_content`` reads of a file
MAX_NAMED = 12  # paths named in the one line; the count says how many in all


@functools.cache
def _compiled() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """One expression for the file patterns and one for the folder patterns (a scan asks every
    path); the group ``gN`` that matched is ``SECRET_FILES[N]``."""
    files: list[str] = []
    folders: list[str] = []
    for n, (pattern, _) in enumerate(SECRET_FILES):
        body = translate("**/" + pattern.rstrip("/")).pattern
        (folders if pattern.endswith("/") else files).append(f"(?P<g{n}>{body})")
    return re.compile("|".join(files)), re.compile("|".join(folders))


def _why(expression: re.Pattern[str], path: str) -> str | None:
    m = expression.match(path)
    return SECRET_FILES[int(m.lastgroup[1:])][1] if m and m.lastgroup else None


@functools.lru_cache(maxsize=4096)
def _folder_why(path: str) -> str | None:
    return _why(_compiled()[1], path)


def by_name(rel: str, *, folder: bool) -> tuple[str, str] | None:
    """``(path, why)`` when ``rel`` looks secret by its name or a folder it is in (``path`` is the
    one that matched: ``.aws`` for ``.aws/config``); None otherwise."""
    for path in prefixes(rel)[:-1]:
        why = _folder_why(path)
        if why is not None:
            return path, why
    why = _folder_why(rel) if folder else _why(_compiled()[0], rel)
    return (rel, why) if why is not None else None


def by_content(head: bytes) -> str | None:
    """Why a file whose first bytes are ``head`` looks secret (a PEM, OpenSSH, PGP or PuTTY private
    key, whatever its name), or None."""
    first = head.lstrip()[:HEAD_BYTES].split(b"\n", 1)[0]
    if first.startswith(b"-----BEGIN ") and b"PRIVATE KEY" in first:
        return f"{KEY} (its first line)"
    if first.startswith(b"PuTTY-User-Key-File-"):
        return f"{KEY} (its first line)"
    return None


def taken_back(rel: str, matched: str, rules: list[Rule]) -> bool:
    """Whether a ``!`` line takes ``rel`` back: one matching ``matched`` (the secret-looking path)
    or a path between it and ``rel``, never a folder above it."""
    paths = [p for p in prefixes(rel) if len(p) >= len(matched)]
    return any(rule.keep and any(rule.pattern.match(p) for p in paths) for rule in rules)


def summary(shown: list[str], ignore_file: str | None) -> str:
    """The one line that names what was left out as secret-looking ("" when nothing was)."""
    if not shown:
        return ""
    named = ", ".join(shown[:MAX_NAMED]) + (", ..." if len(shown) > MAX_NAMED else "")
    return (f"left out of the image as secret-looking: {named} ({len(shown)}); take one back with a '!' line "
            f"in {ignore_file or '.ddpjobignore'}")
