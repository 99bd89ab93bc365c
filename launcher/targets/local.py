"""Local target: N torchrun agents on this machine, one per simulated node, under a detached supervisor.

Layout of a run directory::

    plan.json              what the supervisor runs (the payload of the Plan)
    plan.txt               the rendered plan
    state.json             written by the supervisor: states, pids, exit codes, root cause
    supervisor.log         the supervisor's own messages
    task-<i>/node-<n>.log  output of node n of run i (torchrun prefixes worker lines with [default<local_rank>]:)
    task-<i>/node-<n>.error.json  torchrun's TORCHELASTIC_ERROR_FILE for that agent
    output/ (or output/sweep-<i>/)   DDPJOB_OUTPUT_DIR, unless the spec sets output_dir
"""

from __future__ import annotations

import json
import os
import random
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher import dist
from launcher.errors import TargetError, TargetUnavailable
from launcher.spec import expand
from launcher.specload import LoadedSpec
from launcher.states import JobState
from launcher.targets import procs
from launcher.targets.base import JobStatus, LogFilter, Plan, PlanContext, Target, TaskStatus
from launcher.targets.logtail import LogSource, follow_files
from launcher.targets.torchrun import worker_command

MARKER = "DDPJOB_JOB_ID"


class LocalTarget(Target):
    """Runs every node on this machine. Rendezvous: 127.0.0.1 and a port no live local job uses."""

    name = "local"

    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan:
        spec = loaded.spec
        port = dist.local_rendezvous(spec, ctx.port or 29500).port
        procs_per_node = dist.resolve_procs_per_node(spec, ctx.gpu_count // max(1, spec.nodes))
        # Simulated nodes share this machine's cores.
        cpus_per_node = spec.resources.cpus or max(1, ctx.cpu_count // spec.nodes)
        env_base = dist.process_env(
            spec, "local", cpus_per_node=cpus_per_node, procs_per_node=procs_per_node,
            omp_override=spec.local.omp_num_threads,
        )
        workdir = spec.workdir or ctx.cwd
        output_root = spec.output_dir or f"{ctx.run_dir}/output"
        if not os.path.isabs(output_root):
            output_root = os.path.normpath(os.path.join(workdir, output_root))
        elements = []
        for el in expand(spec, job_id=ctx.job_id, output_root=output_root):
            task_dir = f"{ctx.run_dir}/task-{el.index}"
            nodes = []
            for node in range(spec.nodes):
                env = dict(env_base)
                env.update(el.env)
                env.update({
                    MARKER: ctx.job_id,
                    "DDPJOB_SWEEP_INDEX": str(el.index),
                    "DDPJOB_OUTPUT_DIR": el.output_dir,
                    "TORCHELASTIC_ERROR_FILE": f"{task_dir}/node-{node}.error.json",
                })
                if ctx.gpu_count >= spec.nodes * procs_per_node and ctx.gpu_count > 0:
                    # Give each simulated node its own GPUs, as separate machines would have.
                    first = node * procs_per_node
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(first, first + procs_per_node))
                argv = [
                    ctx.python, "-m", "torch.distributed.run",
                    "--nnodes", str(spec.nodes), "--node-rank", str(node),
                    "--nproc-per-node", str(procs_per_node),
                    "--master-addr", "127.0.0.1", "--master-port", str(port),
                    "--max-restarts", str(spec.max_restarts),
                    "--tee", "3", "--log-dir", f"{task_dir}/torchrun-node-{node}",
                    *worker_command(el.command, ctx.python),
                ]
                nodes.append({
                    "node": node, "argv": argv, "env": dict(sorted(env.items())), "cwd": workdir,
                    "log": f"{task_dir}/node-{node}.log", "error_file": env["TORCHELASTIC_ERROR_FILE"],
                    "torchrun_log_dir": f"{task_dir}/torchrun-node-{node}",
                })
            elements.append({"index": el.index, "params": el.params, "output_dir": el.output_dir, "nodes": nodes})
        payload = {
            "job_id": ctx.job_id, "run_dir": ctx.run_dir, "nodes": spec.nodes, "procs_per_node": procs_per_node,
            "port": port, "stop_on_failure": spec.local.stop_on_failure, "elements": elements,
        }
        return Plan("local", ctx.job_id, spec.name, ctx.run_dir, render_local(payload), payload, port)

    def submit(self, plan: Plan) -> dict[str, Any]:
        python = plan.payload["elements"][0]["nodes"][0]["argv"][0]
        if python == sys.executable:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                raise TargetUnavailable(
                    f"torch is not installed for {python}; the local target runs torchrun: "
                    "pip install 'ddpjob[train]'"
                )
        run_dir = Path(plan.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.json").write_text(json.dumps(plan.payload, indent=1, sort_keys=True))
        (run_dir / "plan.txt").write_text(plan.render())
        env = dict(os.environ)
        env[MARKER] = plan.job_id
        with open(run_dir / "supervisor.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "launcher.targets.local_supervisor", str(run_dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=str(run_dir), close_fds=True,
            )
        return {"run_dir": str(run_dir), "pid": proc.pid, "start": procs.start_time(proc.pid), "job_id": plan.job_id}

    def status(self, handle: dict[str, Any]) -> JobStatus:
        state = read_state(handle["run_dir"])
        sup_alive = procs.alive(handle["pid"], handle.get("start"))
        if state is None:
            if sup_alive:
                return JobStatus(JobState.PENDING, "starting", details={"run_dir": handle["run_dir"]})
            return JobStatus(JobState.FAILED, _supervisor_died(handle), details={"run_dir": handle["run_dir"]})
        job_state = JobState.parse(state["state"])
        message = state.get("message", "")
        if not job_state.terminal and not sup_alive:
            # Re-read: the supervisor may have written its final state just before exiting.
            state = read_state(handle["run_dir"]) or state
            job_state = JobState.parse(state["state"])
            if not job_state.terminal:
                job_state, message = JobState.FAILED, _supervisor_died(handle)
        tasks = [
            TaskStatus(
                index=t["index"], state=JobState.parse(t["state"]), message=t.get("message", ""),
                nodes=t.get("nodes", []), params=t.get("params", {}),
            )
            for t in state.get("elements", [])
        ]
        return JobStatus(job_state, message, tasks, {"run_dir": handle["run_dir"], "port": state.get("port")})

    def logs(self, handle: dict[str, Any], flt: LogFilter, follow: bool = False) -> Iterator[str]:
        plan = _read_plan(handle["run_dir"])
        multi = len(plan["elements"]) > 1

        def sources() -> list[LogSource]:
            out = []
            for el in plan["elements"]:
                if flt.task is not None and el["index"] != flt.task:
                    continue
                for n in el["nodes"]:
                    if flt.node is not None and n["node"] != flt.node:
                        continue
                    label = (f"task{el['index']} " if multi else "") + f"node{n['node']}"
                    out.append(LogSource(n["log"], label, n["node"], plan["procs_per_node"], el["index"]))
            return out

        srcs = sources()
        if flt.task is not None and not srcs:
            raise TargetError(f"task {flt.task} does not exist (this job has {len(plan['elements'])} task(s))")
        yield from follow_files(
            srcs, tail=flt.tail, rank=flt.rank, follow=follow,
            finished=lambda: self.status(handle).state.terminal,
        )

    def cancel(self, handle: dict[str, Any]) -> None:
        run_dir = Path(handle["run_dir"])
        state = read_state(str(run_dir))
        if state is not None and JobState.parse(state["state"]).terminal:
            return
        (run_dir / "cancel-requested").write_text(str(time.time()))
        # The supervisor stops its agents (and their workers) and writes CANCELLED; give it time.
        if procs.alive(handle["pid"], handle.get("start")):
            try:
                os.kill(handle["pid"], 15)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and procs.alive(handle["pid"], handle.get("start")):
                time.sleep(0.1)
        # Whatever is left (a stuck supervisor, a worker that ignored SIGTERM) goes now.
        survivors = procs.kill_marked(MARKER, handle["job_id"], grace=2.0)
        if survivors:
            raise TargetError(f"could not stop processes {survivors} of job {handle['job_id']}")
        state = read_state(str(run_dir))
        if state is None or not JobState.parse(state["state"]).terminal:
            _write_json(run_dir / "state.json", {
                **(state or {"elements": []}), "state": JobState.CANCELLED.value,
                "message": "cancelled by user", "ended": time.time(),
            })


def read_state(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(run_dir, "state.json"), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _read_plan(run_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise TargetError(f"the run directory {run_dir} has no plan.json (was it deleted?)") from e


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _supervisor_died(handle: dict[str, Any]) -> str:
    return f"the supervisor (pid {handle['pid']}) exited without a final state; see {handle['run_dir']}/supervisor.log"


def pick_port(busy: set[int]) -> int:
    """A port free on 127.0.0.1 now and not held by another live local job.

    Chosen below Linux's ephemeral range (32768+), so an outgoing connection is unlikely to take
    it between now and the rendezvous.
    """
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        if port in busy:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise TargetUnavailable("no free port found on 127.0.0.1 in 20000-32000")


def render_local(payload: dict[str, Any]) -> str:
    """Shell-equivalent text of the plan: one block per run and node, env sorted, every word quoted."""
    out = [
        f"# ddpjob local plan: job {payload['job_id']}",
        f"# {payload['nodes']} node(s) x {payload['procs_per_node']} process(es), "
        f"rendezvous 127.0.0.1:{payload['port']}, run dir {payload['run_dir']}",
    ]
    for el in payload["elements"]:
        params = " ".join(f"{k}={v}" for k, v in el["params"].items())
        out.append("")
        out.append(f"## task {el['index']}" + (f" ({params})" if params else "") + f", output {el['output_dir']}")
        for n in el["nodes"]:
            out.append(f"# node {n['node']} -> {n['log']}")
            env = " \\\n    ".join(f"{k}={shlex.quote(v)}" for k, v in n["env"].items())
            out.append(f"(cd {shlex.quote(n['cwd'])} && env \\\n    {env} \\\n  {shlex.join(n['argv'])})")
    return "\n".join(out) + "\n"
