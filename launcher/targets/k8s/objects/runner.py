"""The pod runner as a job carries it: ``podrun.py`` and ``shared/heartbeat.py`` with what they use
(``shared/runfolder.py``, ``straggle.py``, ``vitals.py``, ``restarts.py``, ``told.py``; standard library only) packed into one environment variable, and the ``python3 -c`` line that loads them in the pod.

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
from launcher.targets.shared.runfolder import PLAN, WATCH

BUNDLE_ENV = "DDPJOB_POD_RUNNER"
# In the order they are loaded: heartbeat imports the straggler rule, podrun the others.
MODULES = (("ddpjob_runfolder", "launcher.targets.shared.runfolder"), ("ddpjob_straggle", "launcher.targets.shared.straggle"), ("ddpjob_vitals", "launcher.targets.shared.vitals"),
           ("ddpjob_heartbeat", "launcher.targets.shared.heartbeat"), ("ddpjob_restarts", "launcher.targets.shared.restarts"),
           ("ddpjob_told", "launcher.targets.shared.told"),
           ("ddpjob_podrun", "launcher.targets.k8s.job.podrun"))
BOOT = ("import base64,json,os,sys,types,zlib;"
        f"b=json.loads(zlib.decompress(base64.b64decode(os.environ.pop('{BUNDLE_ENV}'))));"
        "[sys.modules.__setitem__(n,types.ModuleType(n)) or exec(compile(s,n+'.py','exec'),sys.modules[n].__dict__) "
        "for n,s in b];"
        "sys.exit(sys.modules['ddpjob_podrun'].main(sys.argv[1:]))")
DEFAULT_PORT = 29500
# podrun.STALL_EXIT, spelled again: importing podrun (http.server, subprocess) would cost every render
# 20 ms, and podrun may import nothing of ddpjob (a test holds the two equal).
STALL_EXIT = 124
# A TrainJob's runtime restarts the pod whose runner ended a stalled run (JobSet's OnFailure; a TrainJob cannot
# set restartPolicy). So there, with stall.action fail, the runner leaves its verdict in an emptyDir volume,
# which outlives the container, and a restarted runner that finds it exits STALL_EXIT again at once
# (podrun.PodRunner.run) until the Job's backoffLimit fails the TrainJob: nothing trains again.
MARK_ENV = "DDPJOB_STALL_MARK"
MARK_VOLUME = "ddpjob-stall-mark"
MARK_DIR = "/var/run/ddpjob-stall"
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
    return spec.k8s.runner != "none" and spec.k8s.elastic is None


def watch_port(spec: JobSpec) -> int:
    """The pod port that serves ``watch.json``: the one after the rendezvous port (below it at the top)."""
    port = spec.master_port or DEFAULT_PORT
    return port + 1 if port < 65535 else port - 1


def wrap(spec: JobSpec, command: list[str]) -> list[str]:
    """``command`` (torchrun's argv) started by the pod runner."""
    return [spec.k8s.runner, "-c", BOOT, *command]


def env(spec: JobSpec) -> dict[str, str]:
    """The runner's variables: its code, the spec's ``stall:``, the port of ``watch.json`` and, where the
    runtime restarts a pod that ended a stalled run, where its mark is kept (``marks``)."""
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


def marks(spec: JobSpec) -> bool:
    """A TrainJob's runner with ``stall.action: fail`` keeps its verdict in the volume ``MARK_VOLUME``."""
    return spec.k8s.api == "trainjob" and spec.stall.action == "fail" and enabled(spec)


def shown(value: str) -> str:
    """How ``render`` shows the bundle: its size and digest, not 5 kB of base64."""
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    return f"<pod runner: {len(value)} characters, sha256 {digest}; whole in {PLAN}>"


def spec_issues(spec: JobSpec) -> list[Issue]:
    """``stall.action: fail`` where no runner watches the pods."""
    if spec.stall.action != "fail" or enabled(spec):
        return []
    if spec.k8s.runner == "none":
        return [Issue(("stall", "action"), "fail needs ddpjob's pod runner, and k8s.runner: none leaves the pods "
                      "without a stall watch", hint="remove k8s.runner: none, or set stall.action: report")]
    return [Issue(("stall", "action"), "fail is not available for an elastic job (its nodes come and go: no first "
                  "node watches the others)", hint="remove stall.action, or k8s.elastic")]


def header(spec: JobSpec) -> str:
    """The render header's line about the runner."""
    if not enabled(spec):
        why = "k8s.runner: none" if spec.k8s.runner == "none" else "an elastic job has no fixed first node"
        return f"pods run torchrun bare ({why}): no stall watch"
    text = (f"pods start ddpjob's pod runner ({spec.k8s.runner} -c ...: launcher/targets/k8s/job/podrun.py and "
            f"shared/heartbeat.py, carried in {BUNDLE_ENV}, shown shortened) in front of torchrun: stall watch "
            f"(stall.timeout {spec.stall.timeout_s} s, action {spec.stall.action}), {WATCH} on port "
            f"{watch_port(spec)}; k8s.runner: none turns it off")
    if recovers(spec):
        r = spec.recovery
        text += (f"\n# a lost pod (recovery: max_losses {r.max_losses}, min_nodes {r.min_nodes}, lost_after {r.lost_after} s): "
                 "the run starts again on every pod when the operator recreates it, or goes on without a node not "
                 f"heard from for {r.lost_after} s; the program resumes from rank 0's checkpoint")
    if spec.stall.action != "fail":
        return text
    if spec.k8s.api == "trainjob":
        return text + (f"\n# stall.action fail: the stalled pod exits {STALL_EXIT} and keeps the verdict in the volume "
                       f"{MARK_VOLUME} ({MARK_DIR}); restarted by the runtime (JobSet's OnFailure), it exits {STALL_EXIT} "
                       "again at once until the Job's backoffLimit fails the TrainJob (the kubelet's restart back-off: "
                       "minutes; ddpjob cancel ends it now)")
    return text + (f"\n# stall.action fail: the stalled pod exits {STALL_EXIT}; restartPolicy "
                   f"{'ExitCode' if 'restart_policy' not in spec.k8s.model_fields_set else spec.k8s.restart_policy} "
                   "fails the job on it (exit codes 1-127) instead of restarting the pod")
