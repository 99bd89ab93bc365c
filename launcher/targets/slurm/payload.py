"""Rendering for the Slurm target: the sbatch script and each node's torchrun command. Pure text.

The sbatch script is built here, without importing submitit, in exactly the form that
``submitit.slurm.slurm._make_sbatch_string`` writes for the same parameters (same flag order,
quoting and layout). ``SlurmTarget.submit`` checks the two are equal before anything reaches
``sbatch``, and the tests compare the file submitit wrote with ``ddpjob render``, so what render
prints is what Slurm runs.

Job layout under ``<folder>/<job id>/`` (the *job dir*, also submitit's folder)::

    <slurm id>_submission.sh          the sbatch script (arrays: <array id>_submission.sh)
    <slurm id>_submitted.pkl          submitit's pickle of the node runner (arrays: <id>_<i>_...)
    <slurm id>_<task>_log.out|err     submitit's own stdout/stderr of each Slurm task
    task-<i>/node-<n>.log             torchrun output of node n of run i (--tee 3: ranks prefixed)
    task-<i>/node-<n>.json            the node runner's record: host, rendezvous, exit code
    task-<i>/node-<n>.error.json      torchrun's TORCHELASTIC_ERROR_FILE
    output/ (or output/sweep-<i>/)    DDPJOB_OUTPUT_DIR, unless the spec sets output_dir
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from launcher.spec.secrets import shown_value
from launcher.targets.base import Handle
from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm.job.nodeplan import SlurmCommon as SlurmCommon
from launcher.targets.slurm.job.nodeplan import SlurmElement as SlurmElement
from launcher.targets.slurm.job.nodeplan import node_argv as node_argv
from launcher.targets.slurm.job.nodeplan import node_env as node_env
from launcher.targets.slurm.job.nodeplan import node_paths as node_paths

# Values only known inside the job. Render shows them as shell variables; the node runner fills
# them in. A NUL byte marks them because no spec string can contain one (the spec refuses it).
RUNTIME = {
    "node": "\x00SLURM_NODEID",
    "addr": "\x00DDPJOB_MASTER_ADDR",
    "port": "\x00DDPJOB_MASTER_PORT",
    "task": "\x00SLURM_ARRAY_TASK_ID",
}
PREEMPT_SIGNAL = "USR2"  # submitit's default; NCCL takes USR1 for itself

# The rendezvous port, chosen inside the job by the sbatch script, which runs on the first node
# (the rendezvous host): the first port from a start derived from the job id (and array index) on
# which nothing answers, here or on the node's own name, skipping torchrun's defaults 29400/29500.
# Exported, so srun hands it to every node. Bash only: with pyxis the script runs outside the image.
PORT_SETUP = [
    "# ddpjob: a free rendezvous port on this first node, handed to every node through srun's environment",
    'DDPJOB_MASTER_PORT=$(p=$(( 20000 + (${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID} + 7919 * ${SLURM_ARRAY_TASK_ID:-0}) '
    '% 10000 )); h=$(hostname); for _ in $(seq 10000); do case $p in 29400|29500) ;; *) '
    '{ (exec 3<>"/dev/tcp/127.0.0.1/$p") || (exec 3<>"/dev/tcp/$h/$p"); } 2>/dev/null || { echo "$p"; break; } ;; '
    'esac; p=$(( p < 29999 ? p + 1 : 20000 )); done)',
    "export DDPJOB_MASTER_PORT",
]


def submitit_paths(job_dir: str, array: bool) -> tuple[str, str]:
    """submitit's stdout/stderr patterns for its folder (``JobPaths.stdout``/``stderr``)."""
    job = "%A_%a" if array else "%j"
    folder = RunFolder(job_dir)
    return folder.submitit_log(job, "%t", "out"), folder.submitit_log(job, "%t", "err")


def submitit_command(python: str, job_dir: str) -> str:
    """``SlurmExecutor._submitit_command_str``: what each Slurm task runs."""
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(job_dir)])


def _flag(key: str, value: object) -> str:
    key = key.replace("_", "-")
    if value is True:
        return f"#SBATCH --{key}"
    return f"#SBATCH --{key}={shlex.quote(str(value))}"


def sbatch_script(params: dict[str, object], *, job_dir: str, python: str, map_count: int | None) -> str:
    """The sbatch script submitit writes for ``SlurmExecutor(folder=job_dir, python=python)`` with
    ``update_parameters(**params)`` (and ``map_count`` for an array), byte for byte.

    Only the parameters the Slurm target uses are supported: job_name, partition, time, nodes,
    ntasks_per_node, cpus_per_task, gpus_per_node, qos, mem, constraint, account, exclusive,
    setup, signal_delay_s, array_parallelism, srun_args, additional_parameters.
    """
    known = {"job_name", "partition", "time", "nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node",
             "qos", "mem", "constraint", "account", "exclusive", "setup", "signal_delay_s", "array_parallelism",
             "srun_args", "additional_parameters", "wckey"}
    unknown = set(params) - known
    if unknown:
        raise ValueError(f"sbatch_script does not render {sorted(unknown)}")
    flags: dict[str, object] = {k: v for k, v in params.items()
             if v is not None and k not in ("setup", "signal_delay_s", "array_parallelism", "srun_args",
                                             "additional_parameters")}
    flags["signal"] = f"{PREEMPT_SIGNAL}@{params.get('signal_delay_s', 90)}"
    stdout, stderr = submitit_paths(job_dir, map_count is not None)
    if map_count is not None:
        flags["array"] = f"0-{map_count - 1}%{min(map_count, _number(params.get('array_parallelism', 256)))}"
    flags["output"] = stdout.replace("%t", "0")
    flags["error"] = stderr.replace("%t", "0")
    flags["open-mode"] = "append"
    flags.update(_mapping(params.get("additional_parameters") or {}))
    lines = ["#!/bin/bash", "", "# Parameters"]
    lines += [_flag(k, flags[k]) for k in sorted(flags)]
    if params.get("setup") is not None:
        lines += ["", "# setup"] + _words(params["setup"])
    srun = " ".join(shlex.quote(a) for a in
                    ["srun", "--unbuffered", "--output", stdout, "--error", stderr, *_words(params.get("srun_args") or [])])
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", " ".join((srun, submitit_command(python, job_dir))), ""]
    return "\n".join(lines)


# The parameters are the target's own (``_executor_params``): a wrong type is a bug, raised as submitit would.
def _number(value: object) -> float:
    if not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {value!r}")
    return value


def _mapping(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError(f"not a mapping: {value!r}")
    return value


def _words(value: object) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"not a list of strings: {value!r}")
    return [v for v in value if isinstance(v, str)]


# --------------------------------------------------------------------------- per-node command
# SlurmCommon, SlurmElement and each node's paths, argv and env: the node runner's plain data (job/nodeplan.py),
# named here too, where the target and the tests find them (and the pickles of jobs submitted before the move).

def shell_word(word: str) -> str:
    """A shell-quoted word in which RUNTIME markers appear as ``"$VAR"`` expansions."""
    if "\x00" not in word:
        return shlex.quote(word)
    out = []
    for i, part in enumerate(word.split("\x00")):
        if i == 0:
            out.append(shlex.quote(part) if part else "")
            continue
        name = next(m[1:] for m in RUNTIME.values() if part.startswith(m[1:]))
        rest = part[len(name):]
        out.append(f'"${name}"' + (shlex.quote(rest) if rest else ""))
    return "".join(out)


def render_plan(payload: SlurmPayload, masked: frozenset[str] = frozenset()) -> str:
    """What ``ddpjob render --target slurm`` prints: the sbatch script verbatim, then each run's
    per-node command as an equivalent shell line (every word quoted; it never goes through a shell),
    the values of the env names in ``masked`` shown as ``***``."""
    c, elements, script, submission_file = payload.common, payload.elements, payload.script, payload.submission_file
    array = payload.map_count is not None
    runs = payload.map_count or len(elements)  # the array's size: a summarised render shows the first runs
    port = str(c.master_port) if c.master_port else "a free port found by the sbatch script (see # setup)"
    out = [
        f"# ddpjob slurm plan: job {c.job_id}",
        f"# {c.nodes} node(s) x {c.procs_per_node} process(es)"
        + (f", {runs} runs as one job array" if array else "")
        + f"; job dir {c.job_dir}",
        "# Submitted through submitit: the script below is exactly the file submitit writes and sbatch runs.",
        "",
        f"#### sbatch script: {submission_file}",
        script.rstrip("\n"),
        "#### end of sbatch script",
        "",
        *payload.container_text,
        f"#### per-node command: each of the {c.nodes} Slurm task(s) (one per node) runs "
        "launcher.targets.slurm.job.node, which starts torchrun without a shell; set at run time:",
        "#   SLURM_NODEID        this node's index in the allocation",
        "#   DDPJOB_MASTER_ADDR  the first host of $SLURM_JOB_NODELIST (the rendezvous host)",
        f"#   DDPJOB_MASTER_PORT  {port}",
    ]
    if c.max_losses:
        out.append(f"# a node not heard from for {c.lost_after_s} s (recovery.lost_after) is dropped from the job and the "
                   f"run goes on on the nodes left (at least {c.min_nodes}), up to {c.max_losses} time(s) "
                   "(recovery.max_losses): torchrun started again with --nnodes their number and "
                   "DDPJOB_RESTART_COUNT set, the program resuming from its checkpoint")
    node = RUNTIME["node"]
    for el in elements:
        params = " ".join(f"{k}={v}" for k, v in el.params.items())
        out.append("")
        out.append(f"## task {el.index}" + (f" ({params})" if params else "") + f", output {el.output_dir}")
        out.append(f"# log: {shell_word(node_paths(c.job_dir, el.index, node)['log'])}")
        env = node_env(c, el, node=node)
        argv = node_argv(c, el, node=node, addr=RUNTIME["addr"], port=RUNTIME["port"])
        env_text = " \\\n    ".join(f"{k}={shell_word(shown_value(k, v, masked))}" for k, v in env.items())
        out.append(f"(cd {shlex.quote(c.workdir)} && env \\\n    {env_text} \\\n  {' '.join(shell_word(a) for a in argv)})")
    return "\n".join(out) + "\n"


def resolve_folder(folder: str, home: str, cwd: str) -> str:
    """The absolute, normalised Slurm folder: ``~`` is ``home``, relative paths start at ``cwd``."""
    if folder == "~" or folder.startswith("~/"):
        folder = home.rstrip("/") + folder[1:]
    if not os.path.isabs(folder):
        folder = os.path.join(cwd, folder)
    return os.path.normpath(folder)


@dataclass
class OciBundle:
    """The bundle an oci job runs: made at submit from ``image`` unless the user named one (image None);
    ``container.py`` makes it."""

    path: str
    image: str | None = None
    image_id: str = ""
    base: str = ""  # <folder>/oci/<image id>: the image's files, shared by this image's bundles
    config: str = ""  # config.json's text


@dataclass
class SlurmPayload:
    """What ``submit`` hands to submitit: the executor's parameters, the script it must write, runs."""

    common: SlurmCommon
    elements: list[SlurmElement]
    executor_params: dict[str, object]
    map_count: int | None  # the array size for a sweep, else None
    script: str
    run_dir: str
    submission_file: str
    files: dict[str, str] = field(default_factory=dict)  # written before sbatch (podman's task epilog)
    oci: OciBundle | None = None  # the OCI bundle submit makes first (runtime oci)
    container_text: list[str] = field(default_factory=list)  # what render says about the container runtime


@dataclass
class SlurmHandle(Handle):
    """Native ids: ``slurm_job_id`` for a single job, ``<slurm_job_id>_<i>`` for run ``i`` of an array."""

    slurm_job_id: str = ""
    array: bool = False
    runs: int = 1
    nodes: int = 1
    procs_per_node: int = 1
    job_dir: str = ""
    submission_file: str = ""
    params: list[dict[str, str]] = field(default_factory=list)
    container: str = ""  # e.g. "oci bundle /shared/.../oci/<id>-<digest>" or "podman image ..."

    def native_ids(self) -> list[str]:
        return [self.slurm_job_id] if self.slurm_job_id else []

    def log_dir(self) -> str | None:
        return self.job_dir or None
