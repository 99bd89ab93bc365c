"""Typed errors raised by library code.

Library code raises these and never prints or exits; ``launcher.cli.main`` is the one place that turns
them into a message and an exit code (see ``EXIT_CODES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.core.exitcodes import EXIT_CODES  # noqa: F401  (re-exported: the table lives there)


@dataclass(frozen=True)
class Issue:
    """One problem in a job spec.

    Attributes:
        path: field path inside the spec, e.g. ``("resources", "cpus")``; empty for the whole file.
        message: what is wrong.
        hint: how to fix it (optional).
        source: where the value came from when it is not a line of the file, e.g. ``--set nodes=0``.
    """

    path: tuple[str | int, ...]
    message: str
    hint: str | None = None
    source: str | None = None

    @property
    def dotted(self) -> str:
        return dotted_path(self.path)


def dotted_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


class DdpjobError(Exception):
    """Base class of every error ddpjob reports to users without a traceback."""

    exit_code = 1


@dataclass
class SpecError(DdpjobError):
    """A job spec (file, overrides or both) is invalid. Carries every issue found, not just the first."""

    file: str | None
    issues: list[Issue] = field(default_factory=list)
    # Maps a field path to (line, column), 1-based, for the file; filled by the loader.
    locations: dict[tuple[str | int, ...], tuple[int, int]] = field(default_factory=dict)
    ending: str = "nothing was submitted"  # what the last line says was not done (build: nothing built or pushed)

    exit_code = 2

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def locate(self, path: tuple[str | int, ...]) -> tuple[int, int] | None:
        """The line/column of the deepest YAML node on ``path`` that exists in the file."""
        for cut in range(len(path), -1, -1):
            where = self.locations.get(tuple(path[:cut]))
            if where is not None:
                return where
        return None

    def render(self, *, checking: bool = False) -> str:
        """Every issue at its file:line:column (or command-line option) and field, with its hint; the
        last line counts them and, unless ``checking`` (``ddpjob validate``, which submits nothing in
        any case), says that nothing was submitted."""
        lines = []
        for issue in self.issues:
            if issue.source:
                where = issue.source
            elif self.file is None:
                where = "<command line>"
            else:
                loc = self.locate(issue.path)
                # A control character in the name (NUL, ESC) is shown escaped, never sent to the terminal.
                name = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in self.file)
                where = f"{name}:{loc[0]}:{loc[1]}" if loc else name
            # A problem of the whole file (not found, not a mapping) has no field to name.
            lines.append(f"{where}: {issue.dotted}: {issue.message}" if issue.path else f"{where}: {issue.message}")
            if issue.hint:
                lines.append(f"    hint: {issue.hint}")
        count = len(self.issues)
        lines.append(f"{count} problem{'s' if count != 1 else ''} found" + ("." if checking else f"; {self.ending}."))
        return "\n".join(lines)


class UsageError(DdpjobError):
    """A wrong command line that click itself cannot see (bad combination of options)."""

    exit_code = 2


class JobNotFound(DdpjobError):
    """No job with this id in the registry (or, with ``ambiguous``, several start with it)."""

    exit_code = 4

    def __init__(self, job_id: str, suggestions: list[str] | None = None, *, ambiguous: bool = False,
                 why: str | None = None) -> None:
        if why is not None:
            msg = why
        elif not job_id.strip():
            msg = "an empty job id matches no job"
        elif ambiguous:
            msg = f"{job_id!r} is the start of several job ids: {', '.join(suggestions or [])}; give more of the id"
        else:
            msg = f"no job with id {job_id!r}"
            if suggestions:
                msg += f" (did you mean {', '.join(repr(s) for s in suggestions)}?)"
        if not ambiguous:
            msg += "; run `ddpjob list` to see your jobs"
        super().__init__(msg)
        self.job_id = job_id


class TargetUnavailable(DdpjobError):
    """The target cannot be used here: a missing extra, no cluster, no kubeconfig, no Slurm commands."""

    exit_code = 3


class HomeUnusable(TargetUnavailable):
    """``$DDPJOB_HOME`` (the registry's folder) cannot be created, read or written."""

    def __init__(self, home: str, cause: str) -> None:
        super().__init__(f"cannot use {home} ($DDPJOB_HOME, where ddpjob records jobs): {cause}; "
                         "free space or fix its permissions, or point DDPJOB_HOME at a writable folder")
        self.home = home


class FileUnusable(DdpjobError):
    """A file ddpjob was asked to write cannot be written (no such folder, no permission, disk full)."""

    exit_code = 3


class SubmitRejected(DdpjobError):
    """The target refused the job (API server said no, sbatch failed, ...). The message says why."""

    exit_code = 3


class PermissionDenied(SubmitRejected):
    """The scheduler said the user may not do this (Kubernetes 403)."""

    exit_code = 5


class SchedulerComponentMissing(TargetUnavailable):
    """The scheduler lacks a part the job needs (Kubernetes: the PyTorchJob CRD / training operator)."""

    exit_code = 6


class AlreadyExists(SubmitRejected):
    """A job of that name already exists (Kubernetes 409)."""

    exit_code = 7


class InvalidForScheduler(SubmitRejected):
    """The scheduler rejected the object as invalid (Kubernetes 422); its message says why."""

    exit_code = 8


class TargetError(DdpjobError):
    """Talking to the target failed after submission (status, logs, cancel)."""

    exit_code = 3


class NotSubmitted(DdpjobError):
    """The job was reserved but its submission did not complete: it has no logs or tasks."""

    exit_code = 1


class WaitTimeout(DdpjobError):
    """``wait --timeout`` ran out before the job ended; the job keeps running."""

    exit_code = 124
