"""The image a job with ``build:`` runs on: ``repo@sha256:<digest>`` of ``image`` + its working directory.

``prepare`` reads only this machine (the spec, the context's files, their hash); ``pinned`` asks the
registry through the engine whether the content tag (``repo:ctx-<hash>``) is there and, when
``build`` is true and it is not, checks the base image, builds from a staged copy of the context and
pushes. ``resolve`` is what the service calls before planning: it returns the spec with ``image``
replaced by the pinned reference, so every target plans with the digest and ``plan`` stays pure.
Offline (render, ``--dry-run``) nothing is built: the plan names the tag and says a build is needed.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import Issue, TargetUnavailable
from launcher.service.imagebuild import context as buildctx
from launcher.service.imagebuild import requirements, secretfiles, secretfound, secretvalues
from launcher.service.imagebuild.engine import Engine
from launcher.targets.shared.container import IMAGE_RE

if TYPE_CHECKING:
    from launcher.spec.build import BuildOptions
    from launcher.spec.load import LoadedSpec
    from launcher.targets.base import Plan
    from launcher.targets.chosen import Chosen

REGISTRY_ENV = "DDPJOB_BUILD_REGISTRY"


@dataclass(frozen=True)
class Prepared:
    """What a build would make, known without the engine: the tag is the content hash."""

    options: BuildOptions
    repository: str
    base: str
    root: Path
    dockerfile_text: str
    dockerfile_path: Path | None  # the user's own, else None (generated)
    ctx: buildctx.Context
    tag: str

    @property
    def tag_ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def left_out_line(self) -> str:
        """The one line naming what was left out as secret-looking ("" when nothing was)."""
        return secretfiles.summary([o.shown for o in self.ctx.secret_left_out], self.ctx.ignore_file)

    @property
    def unscanned_line(self) -> str:
        """The one line naming the files the content scan did not read ("" when it read them all)."""
        return secretfound.unscanned_line(self.ctx.unscanned)

    def noted(self, line: str) -> str:
        """``line`` of the plan's notes, and the left-out line after it."""
        return line + (f"# build: {self.left_out_line}\n" if self.left_out_line else "")


@dataclass(frozen=True)
class Pinned:
    """The outcome: ``digest`` None when the tag is not in the registry (and was not built)."""

    prepared: Prepared
    digest: str | None
    built: bool = False

    @property
    def ref(self) -> str:
        return f"{self.prepared.repository}@{self.digest}" if self.digest else self.prepared.tag_ref

    def note(self) -> str:
        p = self.prepared
        if self.digest is None:
            return p.noted(f"# build: {p.tag_ref} is not in the registry yet: submit builds and pushes it (or ddpjob "
                           f"build SPEC), then the job names it by digest; context {p.root} ({len(p.ctx.entries)} "
                           f"entries, {buildctx.human(p.ctx.size)})\n")
        how = "built and pushed now" if self.built else "found in the registry (nothing to build)"
        return p.noted(f"# build: {p.tag_ref} {how}; the job runs on {self.ref}\n")


def generated_dockerfile(base: str, workdir: str, reqs: requirements.Requirements | None = None) -> str:
    """FROM the base, the requirements' install step (``requirements``) if any, the context."""
    install = reqs.dockerfile_lines() if reqs is not None else ""
    return f"FROM {base}\n{install}WORKDIR {workdir}\nCOPY . {workdir}\n"


def prepare(loaded: LoadedSpec) -> Prepared:
    """The build's inputs and content tag; spec problems (no registry, no base, a context that is
    missing or too large, a secret value that would go into the image) as one ``SpecError``."""
    prep, issues = survey(loaded)
    if issues:
        raise loaded.error(issues)
    return prep


def survey(loaded: LoadedSpec, *, registry_needed: bool = True) -> tuple[Prepared, list[Issue]]:
    """What ``prepare`` finds, problems returned rather than raised (``ddpjob build --list`` shows
    the context first); only a context that cannot be read at all raises. ``registry_needed``:
    False where nothing is pushed (the listing). The tag is meaningful only without problems."""
    spec = loaded.spec
    opts = spec.build
    assert opts is not None
    issues: list[Issue] = []
    repository = opts.registry or os.environ.get(REGISTRY_ENV, "").strip()
    from launcher.spec.build import valid_repository

    if not repository and registry_needed:
        issues.append(Issue(("build", "registry"), "build: needs a repository to push to",
                            hint=f"set build.registry (e.g. ghcr.io/you/train) or ${REGISTRY_ENV}"))
    elif repository and not valid_repository(repository):
        issues.append(Issue(("build", "registry"), f"${REGISTRY_ENV}={repository!r} is not a repository without tag",
                            hint="e.g. ghcr.io/you/train"))
    if spec.image and not IMAGE_RE.match(spec.image):  # it reaches the engine's command line: never an option
        issues.append(Issue(("image",), "must be an image reference (letters, digits and . _ / : @ + -, not starting "
                            "with '-')"))
    if not spec.image and opts.dockerfile is None:
        issues.append(Issue(("image",), "build: adds the working directory to image:, and there is none",
                            hint="set image: (the base, e.g. ghcr.io/ddpjob/train:0.1.0) or build.dockerfile"))
    spec_dir = Path(loaded.file).resolve().parent if loaded.file and os.path.isfile(loaded.file) else Path.cwd()
    root = (spec_dir / opts.context) if opts.context else Path(spec.workdir or os.getcwd())
    root = root.resolve()
    if not root.is_dir():
        issues.append(Issue(("build", "context"), f"the build context {root} is not a folder"))
        raise loaded.error(issues)
    dockerfile_path = None
    text = generated_dockerfile(spec.image or "", opts.image_workdir)
    if opts.dockerfile is not None:
        dockerfile_path = (root / opts.dockerfile).resolve()
        try:
            text = dockerfile_path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            issues.append(Issue(("build", "dockerfile"), f"{dockerfile_path} cannot be read: {e}"))
    limit = opts.max_context_bytes
    try:
        ctx = buildctx.scan(root, limit=limit, env_files=loaded.env_files, needles=secretvalues.needles(spec))
    except OSError as e:  # a file or folder this user cannot read
        raise loaded.error([*issues, Issue(("build", "context"), f"the build context {root} cannot be read: {e}",
                                           hint="leave the unreadable path out in .ddpjobignore")]) from e
    if ctx.size > limit:
        largest = ", ".join(f"{e.rel} ({buildctx.human(e.size)})" for e in ctx.largest())
        ignore = ctx.ignore_file or ".ddpjobignore"
        issues.append(Issue(("build", "max_context"), f"the build context {root} holds {buildctx.human(ctx.size)} "
                            f"after ignores, more than build.max_context ({opts.max_context}); largest: {largest}",
                            hint=f"leave them out in {root / ignore}, or raise build.max_context"))
    issues += secretvalues.issues(loaded, ctx)  # over the limit, only the spec file's own fields (nothing was read)
    issues += secretfound.issues(secretfound.unaccepted(ctx.findings, opts.allow_secrets), ctx.ignore_file,
                                 secretvalues.spec_in_image(loaded, ctx))
    if opts.requirements is not None and opts.dockerfile is None:
        reqs = requirements.read(root, opts.requirements, {e.rel for e in ctx.entries})
        issues += [Issue(("build", "requirements"), problem, hint="name a file in the context (build.context), and "
                         "keep it and the paths it names out of .ddpjobignore") for problem in reqs.problems]
        text = generated_dockerfile(spec.image or "", opts.image_workdir, reqs)
    tag = buildctx.content_tag(spec.image or "", text, ctx)
    return Prepared(opts, repository, spec.image or "", root, text, dockerfile_path, ctx, tag), issues


def pinned(prep: Prepared, *, build: bool) -> Pinned:
    """Ask the registry for the content tag; build and push it when absent and ``build``."""
    engine = Engine.find(prep.options.engine, prep.options.insecure)
    digest = engine.remote_digest(prep.tag_ref)
    if digest is not None or not build:
        return Pinned(prep, digest)
    from launcher.core.home import ddpjob_home

    if prep.base:
        engine.ensure_base(prep.base, prep.repository.split("/")[0])
    scratch_root = ddpjob_home() / "build"  # beside the user's files, so the staged copy can hard-link them
    try:
        scratch_root.mkdir(parents=True, exist_ok=True)
    except OSError:
        scratch_root = Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix="stage-") as scratch:
        staged = Path(scratch) / "context"
        buildctx.stage(prep.ctx, staged)
        dockerfile = prep.dockerfile_path
        if dockerfile is None:
            dockerfile = Path(scratch) / "Dockerfile"
            dockerfile.write_text(prep.dockerfile_text)
        user_arg = {requirements.USER_ARG: engine.image_user(prep.base)} if requirements.USER_ARG in prep.dockerfile_text else {}
        engine.build(str(staged), str(dockerfile), prep.tag_ref, prep.base, user_arg)
        digest = engine.push(prep.tag_ref, str(Path(scratch) / "digest"))
    done = Pinned(prep, digest, built=True)
    engine.remember(done.ref)
    return done


@dataclass(frozen=True)
class Resolved:
    """A spec with its image pinned, the plan's lines about the image (``note``) and the line for
    people about what the build left out as secret-looking (``left_out``, "" when nothing)."""

    loaded: LoadedSpec
    note: str = ""
    left_out: str = ""
    unscanned: str = ""  # the files the content scan did not read ("" when it read them all)

    @property
    def notices(self) -> tuple[str, ...]:
        """What the command line says on stderr after a submit."""
        return tuple(line for line in (self.left_out, self.unscanned) if line)


def for_target(target: Chosen, loaded: LoadedSpec, *, build: bool) -> Resolved:
    """``resolve`` where ``target`` runs the spec's image; elsewhere ``build:`` is only noted."""
    if loaded.spec.build is not None and not target.runs_image(loaded.spec):
        return Resolved(loaded, f"# build: not used: the {target.name} target does not run the spec's image with "
                        "these settings (local.container, slurm.container.runtime podman or oci, and k8s do)\n")
    return resolve(loaded, build=build)


def resolve(loaded: LoadedSpec, *, build: bool) -> Resolved:
    """``loaded`` with ``image`` pinned by ``build:``, and the plan's note about it.

    ``build``: submitting; the image is built and pushed when the registry lacks it, and any
    engine or registry failure raises (exit 3). Otherwise (render, --dry-run) nothing is built and
    such a failure only becomes the note."""
    if loaded.spec.build is None:
        return Resolved(loaded)
    prep = prepare(loaded)
    try:
        pin = pinned(prep, build=build)
    except TargetUnavailable as e:
        if build:
            raise
        return Resolved(_with_image(loaded, prep.tag_ref), prep.noted(
            f"# build: {prep.tag_ref}; whether the registry has it is unknown ({e}); submit builds it if needed\n"),
            prep.left_out_line, prep.unscanned_line)
    return Resolved(_with_image(loaded, pin.ref), pin.note(), prep.left_out_line, prep.unscanned_line)


def with_build(loaded: LoadedSpec) -> LoadedSpec:
    """``loaded`` with a ``build:`` section: its own, else the defaults (``--build``)."""
    from launcher.spec.build import BuildOptions

    if loaded.spec.build is not None:
        return loaded
    return dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={"build": BuildOptions()}))


def noted(plan: Plan[object], note: str) -> Plan[object]:
    """``plan`` with the note about its image added to what people see."""
    return dataclasses.replace(plan, notes=plan.notes + note) if note else plan


def _with_image(loaded: LoadedSpec, image: str) -> LoadedSpec:
    return dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={"image": image}))
