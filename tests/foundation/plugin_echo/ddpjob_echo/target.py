"""The echo target: ``submit`` starts the spec's command in a session of its own, its output in the run
folder's ``echo.log`` and its exit code in ``echo.exit``; ``status``, ``logs`` and ``cancel`` read them."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from ddpjob_echo.options import EchoOptions
from launcher.core.states import JobState
from launcher.targets.base import Handle, LogFilter, Plan, PlanContext, Target
from launcher.targets.jobstatus import JobStatus

RUN = """import os, subprocess, sys
log, done = sys.argv[1], sys.argv[2]
with open(log, "a") as out:
    out.write(os.environ["ECHO_GREETING"] + "\\n"); out.flush()
    code = subprocess.call(sys.argv[3:], stdout=out, stderr=subprocess.STDOUT)
with open(done + ".tmp", "w") as f:
    f.write(str(code))
os.replace(done + ".tmp", done)
"""


@dataclasses.dataclass(frozen=True)
class EchoPayload:
    command: list[str]
    env: dict[str, str]
    greeting: str
    workdir: str


def render(payload: EchoPayload, masked: frozenset[str]) -> str:
    env = "".join(f"export {k}={'***' if k in masked else v}\n" for k, v in sorted(payload.env.items()))
    return f"# echo target\ncd {payload.workdir}\n{env}echo {payload.greeting}\n{' '.join(payload.command)}\n"


@dataclasses.dataclass
class EchoHandle(Handle):
    pid: int = 0


class EchoTarget(Target[EchoPayload, EchoHandle]):
    name = "echo"

    def plan(self, loaded, ctx: PlanContext) -> Plan[EchoPayload]:
        spec = loaded.spec
        payload = EchoPayload(list(spec.command), dict(spec.env), spec.section(EchoOptions).greeting,
                              spec.workdir or ctx.cwd)
        return Plan(self.name, ctx.job_id, spec.name, ctx.run_dir, payload, render, spec.nodes, 1)

    def owns(self, plan):
        return isinstance(plan.payload, EchoPayload)

    def load_handle(self, data) -> EchoHandle:
        return EchoHandle(**data)

    def submit(self, plan: Plan[EchoPayload]) -> EchoHandle:
        os.makedirs(plan.run_dir, exist_ok=True)
        env = {**os.environ, **plan.payload.env, "ECHO_GREETING": plan.payload.greeting}
        proc = subprocess.Popen([sys.executable, "-c", RUN, *_files(plan.run_dir), *plan.payload.command],
                                cwd=plan.payload.workdir, env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return EchoHandle(plan.job_id, plan.run_dir, proc.pid)

    def status(self, handle: EchoHandle) -> JobStatus:
        _, done = _files(handle.run_dir)
        if os.path.exists(done):
            code = int(_read(done))
            return JobStatus(JobState.SUCCEEDED if code == 0 else JobState.FAILED,
                             "" if code == 0 else f"the command exited {code}")
        if _alive(handle.pid):
            return JobStatus(JobState.RUNNING, "running")
        return JobStatus(JobState.FAILED, "the command's process is gone")

    def logs(self, handle: EchoHandle, flt: LogFilter, follow: bool = False) -> Iterator[str]:
        log, _ = _files(handle.run_dir)
        seen = 0
        while True:
            lines = _read(log).splitlines() if os.path.exists(log) else []
            yield from (f"[echo] {line}" for line in lines[seen:])
            seen = len(lines)
            if not follow or self.status(handle).state.terminal:
                return
            time.sleep(0.2)

    def cancel(self, handle: EchoHandle) -> None:
        if _alive(handle.pid):
            os.killpg(handle.pid, signal.SIGTERM)


def _files(run_dir: str) -> tuple[str, str]:
    return os.path.join(run_dir, "echo.log"), os.path.join(run_dir, "echo.exit")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
