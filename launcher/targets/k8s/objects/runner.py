"""The pod runner as a job carries it: ``podrun.py`` and ``shared/heartbeat.py`` with what they use
(``shared/runfolder.py``, ``straggle.py``, ``vitals.py``, ``restarts.py``, ``told.py``, ``stacks.py``,
``stackshare.py``, the runner core ``jobcore.py`` and ``podstacks.py``; standard library only) packed into one environment variable, and the
``python3 -c`` line that loads them in the pod.

The user's image does not contain ddpjob, so the runner's code travels with the job: JSON of
(module name, source) pairs, zlib-compressed and base64-encoded, in ``DDPJOB_POD_RUNNER``. The
command stays readable (``python3 -c BOOT torchrun ...``); ``BOOT`` pops the variable (so torchrun
and the workers do not inherit it), makes each source a module (``ddpjob_heartbeat``,
``ddpjob_podrun``) and runs ``podrun.main``. The bundle is built at plan time from the installed
package's own files, so the pods run the code of the ddpjob that planned them. ``render`` shows the
variable shortened (``shown``); ``plan.json`` holds it whole.

``k8s.runner: none`` leaves the bare torchrun (an image without Python 3 on its PATH), and with it
the stall watch; an elastic PyTorchJob has no fixed first node, so it runs bare as well.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import zlib

from launcher.core.errors import Issue
from launcher.spec.model import JobSpec
from launcher.targets.k8s.options import K8sOptions
from launcher.targets.shared.runfolder import PLAN, WATCH

BUNDLE_ENV = "DDPJOB_POD_RUNNER"
# In the order they are loaded: heartbeat imports the straggler rule, stackshare stacks, podrun the others
# (through the runner core, jobcore, which every target's runner uses).
MODULES = (("ddpjob_runfolder", "launcher.targets.shared.runfolder"), ("ddpjob_straggle", "launcher.targets.shared.straggle"), ("ddpjob_vitals", "launcher.targets.shared.vitals"),
           ("ddpjob_heartbeat", "launcher.targets.shared.heartbeat"), ("ddpjob_restarts", "launcher.targets.shared.restarts"),
           ("ddpjob_told", "launcher.targets.shared.told"), ("ddpjob_stacks", "launcher.targets.shared.stacks"),
           ("ddpjob_stackshare", "launcher.targets.shared.stackshare"),
           ("ddpjob_jobcore", "launcher.targets.shared.jobcore"),
           ("ddpjob_podstacks", "launcher.targets.k8s.job.podstacks"),
           ("ddpjob_podrun", "launcher.targets.k8s.job.podrun"))
BOOT = ("import base64,json,os,sys,types,zlib;"
        f"b=json.loads(zlib.decompress(base64.b64decode(os.environ.pop('{BUNDLE_ENV}'))));"
        "[sys.modules.__setitem__(n,types.ModuleType(n)) or exec(compile(s,n+'.py','exec'),sys.modules[n].__dict__) "
        "for n,s in b];"
        "sys.exit(sys.modules['ddpjob_podrun'].main(sys.argv[1:]))")
DEFAULT_PORT = 29500
# podrun.END_EXIT, spelled again: importing podrun (http.server, subprocess) would cost every render
# 20 ms, and podrun may import nothing of ddpjob (a test holds the two equal). The runner exits it when it
# ends the run for good: stall.action fail, or a lost pod that recovery cannot survive (past
# recovery.max_losses, below recovery.min_nodes).
END_EXIT = 124
# Where the runtime restarts that pod's container in place (a TrainJob: JobSet's OnFailure; a PyTorchJob
# whose k8s.restart_policy is set to OnFailure), the runner keeps its verdict in an emptyDir volume, which
# outlives the container, and a restarted runner that finds it exits END_EXIT again at once
# (podrun.PodRunner.run) until the backoffLimit fails the job: nothing trains again.
MARK_ENV = "DDPJOB_VERDICT_MARK"
MARK_VOLUME = "ddpjob-verdict"
MARK_DIR = "/var/run/ddpjob-verdict"
# The variables the runner reads (besides the controller's PET_*/MASTER_*): none may come from the spec too.
RECOVERY_ENV = ("DDPJOB_MAX_LOSSES", "DDPJOB_MIN_NODES", "DDPJOB_LOST_AFTER_S")  # the spec's recovery:, podrun reads
RUNNER_ENV = (BUNDLE_ENV, "DDPJOB_STALL_ACTION", "DDPJOB_STALL_TIMEOUT_S", "DDPJOB_WATCH_PORT", MARK_ENV, *RECOVERY_ENV)


@functools.lru_cache(maxsize=1)
def bundle() -> str:
    """The runner's modules, packed (deterministic: the same files give the same text)."""
    sources = []
    for name, module in MODULES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, module
        with open(spec.origin, encoding="utf-8") as f:
            sources.append([name, f.read()])
    return base64.b64encode(zlib.compress(json.dumps(sources).encode(), 9)).decode("ascii")


def enabled(spec: JobSpec) -> bool:
    return spec.section(K8sOptions).runner != "none" and spec.section(K8sOptions).elastic is None


def watch_port(spec: JobSpec) -> int:
    """The pod port that serves ``watch.json``: the one after the rendezvous port (below it at the top)."""
    port = spec.master_port or DEFAULT_PORT
    return port + 1 if port < 65535 else port - 1


def wrap(spec: JobSpec, command: list[str]) -> list[str]:
    """``command`` (torchrun's argv) started by the pod runner."""
    return [spec.section(K8sOptions).runner, "-c", BOOT, *command]


def env(spec: JobSpec) -> dict[str, str]:
    """The runner's variables: its code, the spec's ``stall:`` and ``recovery:``, the port of ``watch.json``
    and, where the runtime restarts in place a pod whose runner ended the run, where its verdict is kept
    (``marks``)."""
    out = {BUNDLE_ENV: bundle(), "DDPJOB_STALL_ACTION": spec.stall.action,
           "DDPJOB_STALL_TIMEOUT_S": str(spec.stall.timeout_s), "DDPJOB_WATCH_PORT": str(watch_port(spec))}
    if marks(spec):
        out[MARK_ENV] = f"{MARK_DIR}/verdict"
    if recovers(spec):
        r = spec.recovery
        out.update(zip(RECOVERY_ENV, (str(r.max_losses), str(r.min_nodes), str(r.lost_after)), strict=True))
    return out


def recovers(spec: JobSpec) -> bool:
    """Whether the pods' runners bring the run back after it loses a pod (``recovery.max_losses``, 2 nodes
    or more)."""
    return enabled(spec) and spec.nodes >= 2 and spec.recovery.max_losses > 0


def ends_run(spec: JobSpec) -> bool:
    """Whether a pod's runner may end the run for good (exit ``END_EXIT``): ``stall.action: fail``, or a
    recovery with a budget."""
    return enabled(spec) and (spec.stall.action == "fail" or recovers(spec))


def restarts_in_place(spec: JobSpec) -> bool:
    """Whether the pod's container is restarted in place when it exits non-zero: a TrainJob's (JobSet's
    OnFailure), a PyTorchJob's whose ``k8s.restart_policy`` is OnFailure (the default ExitCode, where the
    runner may end the run, takes END_EXIT as final: ``pytorchjob.restart_policy``)."""
    if spec.section(K8sOptions).api == "trainjob":
        return True
    return "restart_policy" in spec.section(K8sOptions).model_fields_set and spec.section(K8sOptions).restart_policy == "OnFailure"


def marks(spec: JobSpec) -> bool:
    """The runner keeps its verdict in the volume ``MARK_VOLUME``: it may end the run, and its container
    would be restarted in place."""
    return ends_run(spec) and restarts_in_place(spec)


def shown(value: str) -> str:
    """How ``render`` shows the bundle: its size and digest, not 5 kB of base64."""
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    return f"<pod runner: {len(value)} characters, sha256 {digest}; whole in {PLAN}>"


def spec_issues(spec: JobSpec) -> list[Issue]:
    """``stall.action: fail`` where no runner watches the pods; a volume of the spec's where the runner keeps
    its verdict."""
    if enabled(spec):
        return [Issue(("k8s", "volumes", i), f"the volume {MARK_VOLUME} at {MARK_DIR} is ddpjob's here (where the "
                      "pod runner keeps a verdict that ended the run)", hint="give your volume another name and mount path")
                for i, vol in enumerate(spec.section(K8sOptions).volumes) if marks(spec)
                and (vol.name == MARK_VOLUME or vol.mount_path.rstrip("/") == MARK_DIR)]
    if spec.stall.action != "fail":
        return []
    if spec.section(K8sOptions).runner == "none":
        return [Issue(("stall", "action"), "fail needs ddpjob's pod runner, and k8s.runner: none leaves the pods "
                      "without a stall watch", hint="remove k8s.runner: none, or set stall.action: report")]
    return [Issue(("stall", "action"), "fail is not available for an elastic job (its nodes come and go: no first "
                  "node watches the others)", hint="remove stall.action, or k8s.elastic")]


def header(spec: JobSpec) -> str:
    """The render header's line about the runner."""
    if not enabled(spec):
        why = "k8s.runner: none" if spec.section(K8sOptions).runner == "none" else "an elastic job has no fixed first node"
        return f"pods run torchrun bare ({why}): no stall watch"
    text = (f"pods start ddpjob's pod runner ({spec.section(K8sOptions).runner} -c ...: launcher/targets/k8s/job/podrun.py and "
            f"shared/heartbeat.py, carried in {BUNDLE_ENV}, shown shortened) in front of torchrun: stall watch "
            f"(stall.timeout {spec.stall.timeout_s} s, action {spec.stall.action}), {WATCH} on port "
            f"{watch_port(spec)}; k8s.runner: none turns it off")
    if recovers(spec):
        r = spec.recovery
        text += (f"\n# a lost pod (recovery: max_losses {r.max_losses}, min_nodes {r.min_nodes}, lost_after {r.lost_after} s): "
                 "the run starts again on every pod when the operator recreates it, or goes on without a node not "
                 f"heard from for {r.lost_after} s; the program resumes from rank 0's checkpoint")
    if not ends_run(spec):
        return text
    what = " or ".join(x for x, on in (("a stall (stall.action fail)", spec.stall.action == "fail"),
                                       ("a loss past recovery.max_losses or below recovery.min_nodes", recovers(spec))) if on)
    text += f"\n# the pod whose runner ends the run ({what}) exits {END_EXIT}"
    if not marks(spec):
        return text + (f"; restartPolicy {restart_policy_of(spec)} fails the job on it (exit codes 1-127) instead of "
                       "restarting the pod")
    by = ("the runtime (JobSet's OnFailure)", "the Job's backoffLimit fails the TrainJob") if spec.section(K8sOptions).api == "trainjob" \
        else ("restartPolicy OnFailure", f"backoffLimit ({spec.section(K8sOptions).backoff_limit}) fails the PyTorchJob")
    return text + (f" and keeps the verdict in the volume {MARK_VOLUME} ({MARK_DIR}); restarted in place by {by[0]}, it "
                   f"exits {END_EXIT} again at once until {by[1]} (the kubelet's restart back-off: minutes; ddpjob "
                   "cancel ends it now)")


def restart_policy_of(spec: JobSpec) -> str:
    """A PyTorchJob's replicas' ``restartPolicy``: ``k8s.restart_policy``; left out where the runner may end
    the run (``ends_run``), ExitCode: the runner exits ``END_EXIT`` (124), which ExitCode takes as final
    (1-127) and fails the job, where OnFailure would restart that pod in place. A pod deleted, evicted or
    killed (exit 128 or more) is recreated under ExitCode as under OnFailure."""
    if ends_run(spec) and "restart_policy" not in spec.section(K8sOptions).model_fields_set:
        return "ExitCode"
    return spec.section(K8sOptions).restart_policy
