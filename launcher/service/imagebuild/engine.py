"""The container engine's side of ``build:``: find podman or docker, ask the registry for a tag's
digest, check the base image, build, push. Every call goes through the engine, so its own login
(``podman login``, ``docker login``, credential helpers) is what reaches the registry; ddpjob reads
and stores no credentials. Arguments are lists, never a shell; the engine's words are kept in the
errors, which tell an unreachable registry, a refused login and a missing image apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.core.errors import TargetUnavailable
from launcher.service.imagebuild import watch

LOOKUP_TIMEOUT_S = 60.0
BUILD_TIMEOUT_S = 3600.0

_UNREACHABLE = ("connection refused", "no such host", "i/o timeout", "network is unreachable", "no route to host",
                "dial tcp", "tls: ", "x509:", "server gave http response to https client", "connection reset")
# Phrases only: a bare "401" would match a port (127.0.0.1:40157) or a hex tag.
_AUTH = ("unauthorized", "authentication required", "access to the resource is denied", "denied:", "forbidden",
         "authorization failed", "insufficient_scope")
_ABSENT = ("manifest unknown", "name unknown", "not found", "no such manifest", "does not exist",
           "no such image", "repository name not known")


class BuildUnavailable(TargetUnavailable):
    """The engine or the registry cannot do what ``build:`` needs (exit 3); nothing was submitted."""


class ImageMissing(BuildUnavailable):
    """An image the build needs (the base) is neither here nor in its registry."""


@dataclass(frozen=True)
class Engine:
    """One engine's command line: ``podman`` or ``docker`` (``path``: the program found)."""

    name: str
    path: str
    insecure: bool = False

    # ------------------------------------------------------------------ find
    @staticmethod
    def find(choice: str, insecure: bool = False) -> Engine:
        """``choice``: auto, podman or docker. ``BuildUnavailable`` when it is not installed."""
        names = ("podman", "docker") if choice == "auto" else (choice,)
        for name in names:
            path = shutil.which(name)
            if path:
                return Engine(name, path, insecure)
        wanted = "podman or docker" if choice == "auto" else choice
        raise BuildUnavailable(f"build: needs a container engine and {wanted} is not installed on this machine "
                               f"(PATH={os.environ.get('PATH', '')}); install podman (Debian: apt-get install podman) "
                               "or set build.engine")

    def _tls(self) -> list[str]:
        return ["--tls-verify=false"] if self.insecure and self.name == "podman" else []

    def run(self, args: Sequence[str], *, timeout: float = LOOKUP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([self.path, *args], check=False, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise BuildUnavailable(f"{self.name} {' '.join(args[:2])} did not answer within {timeout:g} s") from e
        except OSError as e:
            raise BuildUnavailable(f"{self.name} cannot be run ({self.path}): {e}") from e

    def run_long(self, args: Sequence[str], *, stalled: str | None = None) -> subprocess.CompletedProcess[str]:
        """A pull, build or push (``watch.run``): ``stalled`` (what it does, naming the registry)
        turns on the no-progress limit; a build stopped by Ctrl-C leaves no container behind."""
        limit = watch.no_progress_limit() if stalled else None
        before = watch.leftovers(self.name) if args[0] == "build" and self.name == "podman" else None
        cleanup = (lambda: watch.clean(self.name, before)) if before is not None else None
        try:
            return watch.run([self.path, *args], timeout=BUILD_TIMEOUT_S, no_progress=limit, stalled=stalled or "",
                             on_interrupt=cleanup)
        except subprocess.TimeoutExpired as e:
            raise BuildUnavailable(f"{self.name} {args[0]} did not end within {BUILD_TIMEOUT_S:g} s") from e
        except OSError as e:
            raise BuildUnavailable(f"{self.name} cannot be run ({self.path}): {e}") from e

    # ------------------------------------------------------------------ the registry
    def remote_digest(self, ref: str) -> str | None:
        """The digest of ``ref`` (``repo:tag``) in its registry, or None when the tag is not there.

        podman: its manifest list machinery reads the remote manifest's descriptor (no layer is
        pulled); docker: ``docker manifest inspect -v``. ``BuildUnavailable`` when the registry cannot
        be reached or refuses the login."""
        if self.name == "podman":
            scratch = f"localhost/ddpjob-lookup-{os.getpid()}-{os.urandom(4).hex()}"
            made = self.run(["manifest", "create", scratch])
            if made.returncode != 0:
                raise BuildUnavailable(f"podman cannot make a manifest list to read {ref}: {last_line(made.stderr)}")
            try:
                added = self.run(["manifest", "add", *self._tls(), scratch, f"docker://{ref}"])
                if added.returncode != 0:
                    self._absent_or_raise(ref, added.stderr)
                    return None
                shown = self.run(["manifest", "inspect", scratch])
                manifests = json.loads(shown.stdout or "{}").get("manifests") or [{}]
                digest = manifests[0].get("digest")
            finally:
                self.run(["manifest", "rm", scratch])
        else:
            found = self.run(["manifest", "inspect", "-v", *(["--insecure"] if self.insecure else []), ref])
            if found.returncode != 0:
                self._absent_or_raise(ref, found.stderr)
                return None
            data = json.loads(found.stdout or "{}")
            data = data[0] if isinstance(data, list) and data else data
            digest = (data.get("Descriptor") or {}).get("digest") if isinstance(data, dict) else None
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            raise BuildUnavailable(f"{self.name} found {ref} but showed no digest for it")
        return digest

    def _absent_or_raise(self, ref: str, stderr: str) -> None:
        """Nothing when the engine said the tag is not there; else the registry's error."""
        kind = classify(stderr)
        if kind != "absent":
            raise registry_error(self, ref, stderr, kind)

    # ------------------------------------------------------------------ build and push
    def ensure_base(self, base: str, registry_host: str) -> None:
        """The base image is here, or can be pulled; ``ImageMissing`` otherwise."""
        found = self.run(["image", "inspect", base])
        if found.returncode == 0:
            return
        self._check_daemon(found.stderr)
        tls = self._tls() if base.split("/")[0] == registry_host else []
        pulled = self.run_long(["pull", *tls, base], stalled=f"the pull of {base} from {base.split('/')[0]}")
        if pulled.returncode != 0:
            self._check_daemon(pulled.stderr)
            raise ImageMissing(f"the base image {base} (image:) is not on this machine and {self.name} cannot pull it: "
                               f"{last_line(pulled.stderr)}; check the name, or log in to its registry "
                               f"({self.name} login {base.split('/')[0]})")

    def _check_daemon(self, stderr: str) -> None:
        """docker's client without its daemon (the registry calls work, builds cannot)."""
        if "cannot connect to the docker daemon" in stderr.lower():
            raise BuildUnavailable(f"docker is installed but its daemon does not answer ({last_line(stderr)}); "
                                   "start it (systemctl start docker), or set build.engine: podman")

    def image_user(self, image: str) -> str:
        """The user ``image`` runs as (its USER; ``root`` when it sets none)."""
        shown = self.run(["image", "inspect", "--format", "{{.Config.User}}", image])
        return (shown.stdout.strip() if shown.returncode == 0 else "") or "root"

    def build(self, context_dir: str, dockerfile: str, tag: str, base: str,
              build_args: dict[str, str] | None = None) -> None:
        args = ["build", "-f", dockerfile, "-t", tag, "--build-arg", f"BASE_IMAGE={base}"]
        for name, value in sorted((build_args or {}).items()):
            args += ["--build-arg", f"{name}={value}"]
        if self.name == "podman":
            args.append("--pull=never")  # the base was checked (and pulled) just before
        done = self.run_long([*args, context_dir])
        if done.returncode != 0:
            self._check_daemon(done.stderr)
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise BuildUnavailable(f"{self.name} build of {tag} failed (exit {done.returncode}):\n{tail}")

    def push(self, ref: str, digest_file: str) -> str:
        """Push ``ref`` (``repo:tag``); returns the digest the registry stored. ``watch.Stalled``
        when the registry stops answering (no progress for the limit)."""
        stalled = f"the push of {ref} to the registry {ref.split('/')[0]}"
        if self.name == "podman":
            done = self.run_long(["push", *self._tls(), "--digestfile", digest_file, ref], stalled=stalled)
        else:
            done = self.run_long(["push", ref], stalled=stalled)
        if done.returncode != 0:
            raise registry_error(self, ref, done.stderr, classify(done.stderr), pushing=True)
        if self.name == "podman":
            with open(digest_file) as f:
                digest = f.read().strip()
        else:
            m = re.search(r"digest: (sha256:[0-9a-f]{64})", done.stdout + done.stderr)
            digest = m.group(1) if m else ""
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise BuildUnavailable(f"{self.name} pushed {ref} but did not say its digest")
        return digest


    def remember(self, pinned_ref: str) -> None:
        """Let this machine's engine know the image by its pushed digest (``repo@sha256:...``), so a
        local or Slurm container runs it without a pull. podman records the digest only when it pulls
        (every blob is here already: nothing is downloaded); docker records it on push. Best effort:
        Kubernetes needs none of it."""
        if self.name == "podman":
            self.run(["pull", *self._tls(), "-q", pinned_ref])


def classify(stderr: str) -> str:
    """``absent``, ``auth``, ``unreachable`` or ``other``, from the engine's words."""
    text = stderr.lower()
    if any(w in text for w in _UNREACHABLE):
        return "unreachable"
    if any(w in text for w in _AUTH):
        return "auth"
    if any(w in text for w in _ABSENT):
        return "absent"
    return "other"


def registry_error(engine: Engine, ref: str, stderr: str, kind: str, *, pushing: bool = False) -> BuildUnavailable:
    host = ref.split("/")[0]
    said = last_line(stderr)
    if kind == "auth":
        return BuildUnavailable(f"the registry {host} refused {'the push of ' if pushing else 'access to '}{ref}: {said}; "
                                f"log in with `{engine.name} login {host}` (ddpjob uses the engine's login and "
                                "stores no credentials)")
    if kind == "unreachable":
        hint = ("; a registry without TLS (a test registry on 127.0.0.1) needs build.insecure: true"
                if "http response to https" in stderr.lower() and not engine.insecure else "")
        return BuildUnavailable(f"the registry {host} cannot be reached: {said}{hint}")
    return BuildUnavailable(f"{engine.name} could not {'push' if pushing else 'look up'} {ref}: {said}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1].removeprefix("Error: ") if lines else "(no message)"
    return line[:500]
