"""What a target may do beyond ``base.Target``'s core: each a small protocol that a target's class has
by defining its method, and lacks otherwise (no flag to keep in step, nothing to override with a
refusal). The service asks before it calls (``launcher.targets.chosen``), and when the target lacks
one, says so and names the registered targets that have it.

- ``PicksPorts``: the service reserves a rendezvous port with the job id, in one registry transaction,
  so jobs submitted at the same moment never share one (local);
- ``DryRunsOnServer``: ``submit --dry-run=server`` asks the scheduler to check the plan (Kubernetes);
- ``CancelsTasks``: ``cancel --task I`` stops one run of a sweep while the others go on (Slurm);
- ``ReadsStacks``: ``ddpjob stacks`` reads every live rank's Python stack (local, Slurm, Kubernetes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from launcher.targets.base import Handle, LogFilter, Plan

if TYPE_CHECKING:
    from launcher.targets.shared.stacks import JobStacks

HandleT_contra = TypeVar("HandleT_contra", bound=Handle, contravariant=True)
PayloadT_contra = TypeVar("PayloadT_contra", contravariant=True)


@runtime_checkable
class PicksPorts(Protocol):
    def pick_port(self, busy: set[int]) -> int:
        """A free rendezvous port not in ``busy`` (the ports the registry holds for running jobs)."""
        ...


@runtime_checkable
class DryRunsOnServer(Protocol[PayloadT_contra]):
    def server_dry_run(self, plan: Plan[PayloadT_contra]) -> str:
        """Ask the scheduler to check ``plan`` without running it; what it said."""
        ...


@runtime_checkable
class CancelsTasks(Protocol[HandleT_contra]):
    def cancel_task(self, handle: HandleT_contra, index: int) -> None:
        """Stop run ``index`` of a sweep; the others go on."""
        ...


@runtime_checkable
class ReadsStacks(Protocol[HandleT_contra]):
    def stacks(self, handle: HandleT_contra, flt: LogFilter) -> JobStacks:
        """Every live rank's Python stack (``launcher.targets.shared.stacks``), read from outside it by
        py-spy; ``flt``'s task, node and rank choose which."""
        ...


def which(capability: type) -> list[str]:
    """The registered targets whose class has ``capability`` (one that cannot be loaded here is left out)."""
    from launcher.core.plugins import load, plugin, target_names

    out = []
    for name in target_names():
        try:
            cls = load(plugin(name).target, f"the {name} target's class")
        except Exception:  # noqa: BLE001 - a plugin broken in any way (PluginError or its own) is named elsewhere
            continue
        if isinstance(cls, type) and issubclass(cls, capability):
            out.append(name)
    return out


def lacking(capability: type, name: str, what: str, instead: str) -> str:
    """Why ``what`` cannot be done on the ``name`` target, which targets can, and ``instead``."""
    able = which(capability)
    can = f" (the {', '.join(able)} target{'s' if len(able) > 1 else ''} can)" if able else ""
    return f"{what} is not supported by the {name} target{can}; {instead}"
