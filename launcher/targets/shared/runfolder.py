"""A job's run folder: the one module that names its files and sub-folders, reads and writes the JSON
ones atomically (``files.write_json``/``read_json``) and hands out what it reads. Nobody else spells
these names (``tests/foundation/test_found_runfolder.py`` holds it); none was renamed, so the run
folders of jobs submitted by an older ddpjob still read.

``RunFolder(run_dir)``, ddpjob's own folder of a job (``$DDPJOB_HOME/runs/<id>``)::

    plan.json            the payload submitted (``to_json``; Slurm's with the secret values masked)
    plan.txt             ``Plan.render()``: what people read, secret values masked
    state.json           local: the supervisor's state      supervisor.note  why state.json is stale
    supervisor.log       local: the supervisor's own output   cancel-requested  local: ``cancel`` asked it to stop
    output/<i>/          the runs' output folders when the spec names none (local, Slurm's in its job folder)
    k8s-status.json      k8s: the job's last status         watch-<i>.json   k8s: run i's last watch read
    pods/<pod>/*.log     k8s: the pods' logs, kept
    notified.json, notifier.log, notifier.pid    the service's notification watcher
    task-<i>/            run (sweep element) i: a ``TaskFolder``

``TaskFolder`` (local: in the run folder; Slurm: in the job's folder on the shared filesystem)::

    node-<n>.log  node-<n>.json (Slurm's node record)  node-<n>.exit.json (local)  node-<n>.error.json
    torchrun-node-<n>/   watch.json (the first node's watch)   vitals/ (the ranks' step reports)
    stacks.json          local: every rank's stack, taken once when the watch named a stall (``shared/stacks.py``)
    stacks.request  node-<n>.stacks.json   Slurm: ``ddpjob stacks`` asking, each node's runner answering
    recovery.json        Slurm: the run's lost nodes, its nodes now and how it ended (``slurm/job/recover.py``)

Slurm's job folder (``<slurm.folder>/<job id>``, submitit's folder) is a ``RunFolder`` too: its
``task-<i>/`` and ``output/`` as above, submitit's ``<slurm id>_submission.sh`` and
``<slurm id>_<task>_log.out|err``, and ddpjob's ``oci-check.sh`` and ``podman-epilog.sh``.

``PodFolder``: the k8s pod runner's own folder in the pod's /tmp (``watch.json``, ``vitals/``, ``output.count``).

Standard library only, nothing of ddpjob at import time and no dataclasses or pathlib: the local
supervisor's quick start, the node wrappers and the k8s pod runner (which carries this file in its
bundle, ``k8s/objects/runner.py``) import it before their children start. A node may be a shell word or a
runtime marker (``"$n"``, Slurm's render): the names are built by formatting, never parsed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from launcher.core.jsondata import JSONObject

PLAN = "plan.json"
PLAN_TEXT = "plan.txt"
STATE = "state.json"
STALE_NOTE = "supervisor.note"
SUPERVISOR_LOG = "supervisor.log"
CANCEL_REQUESTED = "cancel-requested"
OUTPUT = "output"
K8S_STATUS = "k8s-status.json"
PODS = "pods"
NOTIFIED = "notified.json"
NOTIFIER_LOG = "notifier.log"
NOTIFIER_PID = "notifier.pid"
OCI_CHECK = "oci-check.sh"
PODMAN_EPILOG = "podman-epilog.sh"
WATCH = "watch.json"
RECOVERY = "recovery.json"
STACKS = "stacks.json"
STACKS_REQUEST = "stacks.request"
STACKS_SUFFIX = ".stacks.json"
VITALS = "vitals"
OUTPUT_COUNT = "output.count"
LOG_SUFFIX = ".log"
EXIT_SUFFIX = ".exit.json"
# Every name above and the patterns below, for the test that no other module spells them.
NAMES = (PLAN, PLAN_TEXT, STATE, STALE_NOTE, SUPERVISOR_LOG, CANCEL_REQUESTED, K8S_STATUS, NOTIFIED, NOTIFIER_LOG, NOTIFIER_PID,
         WATCH, RECOVERY, OUTPUT_COUNT, EXIT_SUFFIX, ".error.json", "task-", "node-", "torchrun-node-", "watch-",
         OCI_CHECK, PODMAN_EPILOG, "_submission.sh", "_log.out", "_log.err")


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}"  # as the plans always spelled them (goldens): a folder never ends in "/"


class TaskFolder:
    """``task-<i>/``: the files of one run's nodes, and the run's watch and vitals."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def log(self, node: int | str) -> str:
        """Node ``node``'s output (torchrun's and the node runner's)."""
        return _join(self.path, f"node-{node}{LOG_SUFFIX}")

    def record(self, node: int | str) -> str:
        """Slurm: node ``node``'s record (``slurm/job/node.py``: host, state, exit code)."""
        return _join(self.path, f"node-{node}.json")

    def error_file(self, node: int | str) -> str:
        """torchrun's ``TORCHELASTIC_ERROR_FILE`` of node ``node`` (the root cause)."""
        return _join(self.path, f"node-{node}.error.json")

    def exit_file(self, node: int | str) -> str:
        """Local: how node ``node``'s agent ended (``local/job/node.py``)."""
        return exit_file(self.log(node))

    def torchrun_logs(self, node: int | str) -> str:
        """Node ``node``'s torchrun log folder (``--log-dir``)."""
        return _join(self.path, f"torchrun-node-{node}")

    @property
    def watch(self) -> str:
        """The first node's ``heartbeat.Watch`` state (``launcher.targets.shared.health`` reads it)."""
        return _join(self.path, WATCH)

    @property
    def recovery(self) -> str:
        """Slurm: the run's lost nodes and its nodes now, written by the first node's runner."""
        return _join(self.path, RECOVERY)

    @property
    def stacks(self) -> str:
        """Local: every rank's stack when the watch named a stall (``shared/stacks.where``)."""
        return _join(self.path, STACKS)

    @property
    def stacks_request(self) -> str:
        """Slurm: ``ddpjob stacks``'s request, which every node's runner answers (``shared/stackshare.Answerer``)."""
        return _join(self.path, STACKS_REQUEST)

    def node_stacks(self, node: int | str) -> str:
        """Slurm: node ``node``'s answer to the last ``stacks_request``: its ranks' stacks."""
        return _join(self.path, f"node-{node}{STACKS_SUFFIX}")

    @property
    def vitals(self) -> str:
        """The ranks' step reports (``DDPJOB_VITALS_DIR``)."""
        return _join(self.path, VITALS)

    def read_recovery(self) -> JSONObject | None:
        """Slurm: ``recovery.json`` as a mapping, or None where the run lost no node."""
        from launcher.targets.shared.files import read_json

        data = read_json(self.recovery)
        return data if isinstance(data, dict) else None

    def read_watch(self) -> JSONObject | None:
        """``watch.json`` as a mapping, or None before its first write (or when it is not one)."""
        from launcher.targets.shared.files import read_json

        data = read_json(self.watch)
        return data if isinstance(data, dict) else None


def exit_file(log: str) -> str:
    """Local: where the node whose output goes to ``log`` records how its agent ended."""
    return f"{os.path.splitext(log)[0]}{EXIT_SUFFIX}"


def log_of_exit_file(path: str) -> str:
    """The node log beside exit record ``path`` (``exit_file``'s inverse)."""
    return path[: -len(EXIT_SUFFIX)] + LOG_SUFFIX


def node_tag(index: int, node: int) -> str:
    """Node ``node`` of run ``index`` named outside the run folder (its cgroup), as its files are."""
    return f"task-{index}-node-{node}"


class PodFolder:
    """The k8s pod runner's own folder (in the pod's /tmp, removed when the runner ends)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def output_count(self) -> str:
        """A sparse file whose size is the bytes torchrun wrote (what ``heartbeat`` measures as output)."""
        return os.path.join(self.path, OUTPUT_COUNT)

    @property
    def watch(self) -> str:
        return os.path.join(self.path, WATCH)

    @property
    def vitals(self) -> str:
        return os.path.join(self.path, VITALS)


WATCH_URL_PATH = "/" + WATCH  # where the first pod's runner serves its watch.json (k8s: the API server's pod proxy)
STACKS_URL_PATH = "/" + STACKS  # where each pod's runner answers ddpjob stacks with its ranks' stacks (k8s)


class RunFolder:
    """ddpjob's folder of one job: its plan, the target's state files and each run's ``TaskFolder``."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def plan(self) -> str:
        return self._file(PLAN)

    @property
    def plan_text(self) -> str:
        return self._file(PLAN_TEXT)

    @property
    def state(self) -> str:
        return self._file(STATE)

    @property
    def stale_note(self) -> str:
        return self._file(STALE_NOTE)

    @property
    def supervisor_log(self) -> str:
        return self._file(SUPERVISOR_LOG)

    @property
    def cancel_requested(self) -> str:
        return self._file(CANCEL_REQUESTED)

    @property
    def output(self) -> str:
        """The runs' output folders' parent when the spec's ``output_dir`` is not set."""
        return _join(self.path, OUTPUT)

    @property
    def k8s_status(self) -> str:
        return self._file(K8S_STATUS)

    @property
    def pods(self) -> str:
        return self._file(PODS)

    @property
    def notified(self) -> str:
        return self._file(NOTIFIED)

    @property
    def notifier_log(self) -> str:
        return self._file(NOTIFIER_LOG)

    @property
    def notifier_pid(self) -> str:
        return self._file(NOTIFIER_PID)

    def kept_watch(self, index: int) -> str:
        """k8s: the last ``watch.json`` read of run ``index`` through the pod proxy, for ``top`` once the pods are gone."""
        return self._file(f"watch-{index}.json")

    # Slurm's job folder: submitit names its files by the Slurm job id (a pattern such as %j, or a placeholder, in a plan).
    def submission_script(self, slurm_id: str) -> str:
        """The sbatch script submitit writes (arrays: by the array's id)."""
        return _join(self.path, f"{slurm_id}_submission.sh")

    def submitit_log(self, slurm_id: str, task: str, stream: str) -> str:
        """submitit's own ``stream`` (``out`` or ``err``) of Slurm task ``task``."""
        return _join(self.path, f"{slurm_id}_{task}_log.{stream}")

    @property
    def oci_check(self) -> str:
        """Slurm ``runtime: oci``: the check each task starts with (``slurm/container.py``)."""
        return _join(self.path, OCI_CHECK)

    @property
    def podman_epilog(self) -> str:
        """Slurm ``runtime: podman``: the task epilog that removes the node's container."""
        return _join(self.path, PODMAN_EPILOG)

    def task(self, index: int | str) -> TaskFolder:
        """Run ``index``'s folder (``index`` may be a shell expansion: ``"${SLURM_ARRAY_TASK_ID:-0}"``)."""
        return TaskFolder(_join(self.path, f"task-{index}"))

    # JSON files, written atomically (``files.write_json``); a read is None when the file is missing or not JSON.
    def read_plan(self) -> object:
        """``plan.json`` as JSON data, for its readers only: the record others read
        (``shared/planrecord.read_plan_record``) and the target's own payload (``local/payload.read_plan``)."""
        from launcher.targets.shared.files import read_json

        return read_json(self.plan)

    def write_plan(self, data: object, text: str) -> None:
        """``plan.json`` (``data``) and ``plan.txt`` (``text``), each written atomically."""
        from launcher.targets.shared.files import atomic_write, write_json

        write_json(self.plan, data)
        atomic_write(self.plan_text, text)

    def read_state(self) -> dict[str, object] | None:
        """``state.json`` (the local supervisor's) as a mapping, or None before its first write: for its
        one reader, ``local/job/staterecord.read_state``, which types it."""
        from launcher.targets.shared.files import read_json

        data = read_json(self.state)
        return dict(data) if isinstance(data, dict) else None

    def write_state(self, data: dict[str, object]) -> None:
        from launcher.targets.shared.files import write_json

        write_json(self.state, data)
