"""The local supervisor's answer to a rendezvous port that another program took between the choice
and torchrun's bind: see that it happened, take a new port, start the run again there.

Imported only when a run failed (the supervisor's quick start never loads it).
"""

from __future__ import annotations

from pathlib import Path

from launcher.core.errors import TargetError
from launcher.targets.local.job.statefile import say
from launcher.targets.local.payload import LocalElement, LocalPayload, moved_port_text
from launcher.targets.local.payload import move_port as move_plan_port
from launcher.targets.local.payload import read_plan as read_typed_plan
from launcher.targets.shared.files import atomic_write, to_json, write_json
from launcher.targets.shared.runfolder import RunFolder


def port_was_taken(plan: LocalPayload, el: LocalElement, marks: dict[int, int]) -> bool:
    """The run failed because another program took the rendezvous port between the choice and
    torchrun's bind, before any worker started: worth another port (not the spec's own).
    ``marks``: each node log's size before the run started, by node."""
    # A bridge network gives each container its own network namespace: no other program holds its ports.
    if plan.port_fixed or plan.network_name:
        return False
    master = el.nodes[0]
    try:
        with open(master.log, "rb") as f:
            f.seek(marks.get(master.node, 0))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return False
    if "EADDRINUSE" not in text and "Address already in use" not in text:
        return False
    return not any(next(Path(n.torchrun_log_dir).glob("*/attempt_*/*"), None) for n in el.nodes)


def move_port(plan: LocalPayload, run_dir: str, attempt: int, attempts: int) -> int | None:
    """A new free port for this and every later run of ``plan`` (changed in place), from the
    service's port command (which records it for the job); the plan files then show the port
    actually used. None when no port could be had (the run's failure stands)."""
    import subprocess

    old = plan.port
    if not plan.port_command or old is None:
        return None
    proc = subprocess.run(plan.port_command, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip().isdigit():
        say(f"[ddpjob] rendezvous port {old} was taken and no other could be had: "
            f"{proc.stderr.strip() or proc.stdout.strip()}")
        return None
    new = int(proc.stdout.strip())
    move_plan_port(plan, new)  # plain namespaces of the payload's shape (the supervisor's read_plan)
    try:
        typed = read_typed_plan(run_dir)
        move_plan_port(typed, new)
        folder = RunFolder(run_dir)
        write_json(folder.plan, to_json(typed))
        with open(folder.plan_text, encoding="utf-8") as f:
            text = f.read()
        atomic_write(folder.plan_text, moved_port_text(text, old, new))
    except (OSError, ValueError, TargetError) as e:
        say(f"[ddpjob] could not record port {new} in the plan files: {e}")
    note = (f"[ddpjob] rendezvous port {old} was taken by another program before torchrun could bind it; "
            f"starting the nodes again on port {new} (attempt {attempt + 1} of {attempts})\n")
    say(note.rstrip("\n"))
    for el in plan.elements:
        for n in el.nodes:
            try:
                with open(n.log, "a", encoding="utf-8") as log:
                    log.write(note)
            except OSError:
                pass
    return new
