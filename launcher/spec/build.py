"""The spec's ``build:`` section: make the job's image from ``image`` plus the working directory,
push it, and run the job on the pushed digest (``repo@sha256:...``).

Read by the service (``launcher.service.imagebuild``) for the targets that run an image (Kubernetes,
``local.container``, the Slurm container runtimes). Kept apart from ``model.py`` so that module
stays small. Registry credentials are never part of a spec: the engine's own login is used.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from launcher.core.fields import no_control

# A repository to push to, without tag or digest: [host[:port]/]path, lowercase as registries require.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = re.compile(rf"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*$")
DEFAULT_MAX_CONTEXT = "2Gi"
# A path in the context that a generated Dockerfile names (COPY, WORKDIR): no wildcards, no spaces.
CONTEXT_PATH_RE = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*$")


class BuildOptions(BaseModel):
    """Build ``image`` + the working directory into a new image, push it and pin the job to its digest.

    The image's tag is a hash of the base image reference, the Dockerfile's text and the context's
    files (paths, modes, contents, after ``.ddpjobignore`` or ``.dockerignore``): an unchanged
    directory is found in the registry and neither rebuilt nor pushed again."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    registry: str | None = Field(
        None,
        description="The repository to push to, without a tag, e.g. 'ghcr.io/team/train' or "
        "'127.0.0.1:5000/team/train'. Default: $DDPJOB_BUILD_REGISTRY. Log in with the engine "
        "(podman login / docker login); ddpjob stores no credentials.",
    )
    context: str | None = Field(
        None,
        description="The folder copied into the image. Relative paths are taken from the spec file's "
        "directory. Default: workdir:, else the directory you submit from. Files listed in its "
        ".ddpjobignore (or else .dockerignore, same syntax) are left out; without either, .git, "
        ".venv and Python caches are.",
    )
    dockerfile: str | None = Field(
        None,
        description="Your own Dockerfile (relative to the context). Default: a generated one, "
        "FROM image, WORKDIR image_workdir, COPY the context there. Yours gets the spec's image as "
        "the build argument BASE_IMAGE (ARG BASE_IMAGE / FROM ${BASE_IMAGE}).",
    )
    engine: Literal["auto", "podman", "docker"] = Field(
        "auto", description="The engine that builds and pushes: podman or docker; auto: podman if installed, else docker."
    )
    image_workdir: str = Field(
        "/workspace",
        description="Where the context goes in the generated image, and its WORKDIR (the pods' working "
        "directory unless k8s.workdir says otherwise).",
    )
    insecure: bool = Field(
        False,
        description="The registry speaks plain HTTP or has a certificate this machine does not trust "
        "(podman --tls-verify=false; docker decides by its daemon's insecure-registries). For a "
        "test registry on 127.0.0.1 only.",
    )
    max_context: StrictInt | str = Field(
        DEFAULT_MAX_CONTEXT,
        description="The most the context may hold (after ignores), e.g. '500Mi' (or bytes); a larger one is "
        "refused, naming its largest files (add them to .ddpjobignore).",
    )
    allow_secrets: list[str] = Field(
        default_factory=list,
        description="Files of the context that may go into the image although the content scan finds a secret-looking "
        "value in them: 'path' (every finding in that file) or 'path:line' (one finding), relative to the context, e.g. "
        "['tests/fixtures/fake_key.pem', 'config/settings.py:12']. An allow comment on the line does the same "
        "('# ddpjob: allow-secret', or detect-secrets' 'pragma: allowlist secret'); leaving the file out in "
        ".ddpjobignore keeps it out of the image instead.",
    )

    requirements: str | None = Field(
        None,
        description="What your code needs beyond the base image, installed with pip (python3 -m pip, as root) "
        "into a layer of its own that the engine's cache keeps until they change: a requirements file in the "
        "context (e.g. 'requirements.txt', pip's syntax; its local paths, such as ./wheels/x.whl, -f wheels or "
        "-r more.txt, are relative to the file and go in with it), or a pyproject.toml in the context for its "
        "[project] dependencies. Relative to the context. Not with build.dockerfile (yours installs what it needs).",
    )

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: str | None) -> str | None:
        if v is not None and not valid_repository(v):
            raise ValueError("must be a repository without tag or digest, e.g. 'ghcr.io/team/train' or "
                             "'127.0.0.1:5000/team/train' (lowercase path)")
        return v

    @field_validator("context", "dockerfile")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None:
            no_control(v, "the path")
            if not v.strip():
                raise ValueError("is empty")
        return v

    @field_validator("allow_secrets")
    @classmethod
    def _allow_secrets(cls, v: list[str]) -> list[str]:
        for item in v:
            no_control(item, "the path")
            if not item.strip() or item.startswith("/") or ".." in item.split("/"):
                raise ValueError(f"{item!r}: must be a path inside the context, optionally with ':LINE', e.g. "
                                 "'config/settings.py' or 'config/settings.py:12'")
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: str | None) -> str | None:
        if v is not None and (not CONTEXT_PATH_RE.match(v) or ".." in v.split("/")):
            raise ValueError("must be a path inside the context of letters, digits, '.', '_', '-' and '/', e.g. "
                             "'requirements.txt' or 'pyproject.toml'")
        return v

    @model_validator(mode="after")
    def _requirements_need_generated_dockerfile(self) -> BuildOptions:
        if self.requirements is not None and self.dockerfile is not None:
            raise ValueError("build.requirements goes with the generated Dockerfile only: with build.dockerfile, "
                             "install them in your Dockerfile (RUN pip install -r ...), or drop build.dockerfile")
        return self

    @field_validator("image_workdir")
    @classmethod
    def _image_workdir(cls, v: str) -> str:
        if not v.startswith("/") or not re.fullmatch(r"/[A-Za-z0-9._/-]*", v) or "/../" in f"{v}/":
            raise ValueError("must be an absolute path of letters, digits, '.', '_', '-' and '/'")
        return v

    @field_validator("max_context")
    @classmethod
    def _max_context(cls, v: int | str) -> int | str:
        if size_bytes(v) is None:
            raise ValueError("must be a size such as '500Mi', '2Gi' or '800M' (binary Ki/Mi/Gi/Ti or decimal K/M/G/T)")
        return v

    @property
    def max_context_bytes(self) -> int:
        return size_bytes(self.max_context) or 0


_SIZE_RE = re.compile(r"^\s*(\d{1,15})\s*(Ki|Mi|Gi|Ti|K|M|G|T)?\s*$")
_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def size_bytes(text: int | str) -> int | None:
    """``'500Mi'`` (or a number of bytes) as bytes; None when it is not such a size."""
    if isinstance(text, int):
        return text if text >= 0 else None
    m = _SIZE_RE.match(text)
    return int(m.group(1)) * _UNITS[m.group(2)] if m else None


def valid_repository(text: str) -> bool:
    """A repository reference without tag or digest (``host:port/path``)."""
    return len(text) <= 255 and REPOSITORY_RE.match(text) is not None
