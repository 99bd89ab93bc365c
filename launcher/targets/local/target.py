"""Local target: N torchrun agents on this machine, one per simulated node, under a detached supervisor.

Layout of a run directory::

    plan.json              what the supervisor runs (the payload of the Plan; secret env values as ***: those reach the supervisor in its environment)
    plan.txt               the rendered plan
    state.json             written by the supervisor: states, pids, exit codes, root cause
    supervisor.log         the supervisor's own messages
    task-<i>/node-<n>.log  output of node n of run i (torchrun prefixes worker lines with [default<local_rank>]:)
    task-<i>/node-<n>.error.json  torchrun's TORCHELASTIC_ERROR_FILE for that agent
    output/ (or output/sweep-<i>/)   DDPJOB_OUTPUT_DIR, unless the spec sets output_dir
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from launcher.core.errors import Issue, TargetError, TargetUnavailable
from launcher.core.states import JobState
from launcher.targets.base import LogFilter, Plan, PlanContext, Target
from launcher.targets.jobstatus import JobStatus
from launcher.targets.local import container as ctr
from launcher.targets.local import network as net
from launcher.targets.local import ports, watch
from launcher.targets.local.job.staterecord import StateRecord, read_state, write_state
from launcher.targets.local.options import LocalOptions
from launcher.targets.local.payload import (
    MARKER,
    PORT_AT_SUBMIT,
    LocalElement,
    LocalHandle,
    LocalNode,
    LocalPayload,
    read_plan,
    render_local,
)
from launcher.targets.local.status import job_status
from launcher.targets.shared import netif, procs
from launcher.targets.shared.files import atomic_write, from_json, read_json, to_json
from launcher.targets.shared.launch import run_env, torchrun_argv, worker_command
from launcher.targets.shared.runfolder import RunFolder

if TYPE_CHECKING:
    from launcher.spec.load import LoadedSpec
    from launcher.spec.model import JobSpec
    from launcher.targets.shared.container import LocalInputs
    from launcher.targets.shared.stacks import JobStacks

__all__ = ["MARKER", "LocalElement", "LocalHandle", "LocalNode", "LocalPayload", "LocalTarget", "read_plan",
           "render_local"]

NCCL_DEFAULTS = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}


def threads_note(spec: JobSpec, threads: str, procs_per_node: int, cpu_count: int) -> str:
    """What the plan says when a run's processes ask for more OpenMP threads than this machine has
    cores; "" when they do not. resources.cpus is what each node may use wherever it runs, so here it
    can ask for more than the machine has; one thread per process is the least there is, never named."""
    processes = spec.nodes * procs_per_node  # a sweep's runs take turns: one run's processes at a time
    if not threads.isdigit() or int(threads) <= 1 or int(threads) * processes <= cpu_count:
        return ""
    if "OMP_NUM_THREADS" in spec.env:  # env wins over ddpjob's own value
        source, field = "env.OMP_NUM_THREADS", "env.OMP_NUM_THREADS"
    elif spec.section(LocalOptions).omp_num_threads:
        source, field = "local.omp_num_threads", "local.omp_num_threads"
    else:
        source = f"resources.cpus {spec.resources.cpus} / {procs_per_node} process(es) per node"
        field = "local.omp_num_threads"
    return (f"{processes} processes x OMP_NUM_THREADS={threads} ({source}) = {int(threads) * processes} threads on "
            f"this machine's {cpu_count} core(s): oversubscribed, every rank waits for a core; "
            f"{field}: {max(1, cpu_count // processes)} gives each process its share")


class LocalTarget(Target[LocalPayload, LocalHandle]):
    """Runs every node on this machine. Rendezvous: 127.0.0.1 and a port no live local job uses."""

    name = "local"
    passes_host_env = True  # the supervisor and its agents inherit the submitting environment

    def preflight(self, loaded: LoadedSpec, ctx: PlanContext) -> list[Issue]:
        from launcher.targets.shared.preflight import missing_program

        spec = loaded.spec
        # In a container, a module may live in the image only: check scripts (in the mounted workdir) alone.
        issues = missing_program(spec.command, spec.workdir or ctx.cwd, check_modules=spec.section(LocalOptions).container == "none")
        if spec.section(LocalOptions).container == "none" and spec.nccl.socket_ifname:  # the nodes are this machine
            value = spec.nccl.socket_ifname
            _, problem = netif.check({"NCCL_SOCKET_IFNAME": value, "GLOO_SOCKET_IFNAME": value}, "this machine")
            if problem:
                issues.append(Issue(("nccl", "socket_ifname"), problem.split(". Set ")[0],
                                    hint="name one of this machine's interfaces, e.g. lo, or leave it unset"))
        return issues

    def inputs(self, loaded: LoadedSpec, *, online: bool) -> LocalInputs | None:
        local = loaded.spec.section(LocalOptions)
        if local.container == "none":
            return None
        inputs = ctr.read_inputs()
        if local.network == "bridge":  # what the job's subnet must not overlap (render too: no engine, none)
            inputs.used_subnets = tuple(net.used_subnets(local.container))
        return inputs

    def runs_image(self, spec: JobSpec) -> bool:
        return spec.section(LocalOptions).container != "none"

    def owns(self, plan: Plan[object]) -> TypeGuard[Plan[LocalPayload]]:
        return isinstance(plan.payload, LocalPayload)

    def load_handle(self, data: dict[str, object]) -> LocalHandle:
        return from_json(LocalHandle, data)

    def plan(self, loaded: LoadedSpec, ctx: PlanContext) -> Plan[LocalPayload]:
        # Imported here: status, logs, cancel and the supervisor never load the spec's models.
        from launcher.spec.sweep import expand
        from launcher.targets.shared import dist

        spec = loaded.spec
        port = spec.master_port or ctx.port
        port_text = str(port) if port is not None else PORT_AT_SUBMIT
        procs_per_node = dist.resolve_procs_per_node(spec, ctx.gpu_count // max(1, spec.nodes))
        cpus_per_node = spec.resources.cpus or max(1, ctx.cpu_count // spec.nodes)  # the nodes share its cores
        workdir = spec.workdir or ctx.cwd
        output_root = spec.output_dir or RunFolder(ctx.run_dir).output
        if not os.path.isabs(output_root):
            output_root = os.path.normpath(os.path.join(workdir, output_root))
        engine = spec.section(LocalOptions).container
        python = ctr.IMAGE_PYTHON if engine != "none" else ctx.python
        runs = expand(spec, job_id=ctx.job_id, output_root=output_root)
        issues = ctr.plan_issues(spec, workdir, ctx.run_dir, [el.output_dir for el in runs]) if engine != "none" else []
        issues += net.plan_issues(spec.section(LocalOptions).network, engine, spec.nodes)
        if issues:
            raise loaded.error(issues)
        used = list(ctx.inputs.used_subnets) if isinstance(ctx.inputs, ctr.LocalInputs) else []
        subnet = net.job_subnet(ctx.job_id, used, spec.section(LocalOptions).container) if spec.section(LocalOptions).network == "bridge" else None
        addresses = [net.node_address(subnet, n) if subnet else "127.0.0.1" for n in range(spec.nodes)]
        env_base = dist.process_env(
            spec, {**NCCL_DEFAULTS, **net.NCCL_IFACE} if subnet else NCCL_DEFAULTS, cpus_per_node=cpus_per_node,
            procs_per_node=procs_per_node, omp_override=spec.section(LocalOptions).omp_num_threads,
        )
        if engine == "none" and env_base.get("GLOO_SOCKET_IFNAME"):  # the nodes are this machine: Gloo's exact names
            names = netif.gloo_names(env_base["GLOO_SOCKET_IFNAME"], netif.interfaces())
            env_base["GLOO_SOCKET_IFNAME"] = ",".join(names) or env_base["GLOO_SOCKET_IFNAME"]
        elements = []
        for el in runs:
            task = RunFolder(ctx.run_dir).task(el.index)
            nodes = []
            for node in range(spec.nodes):
                error_file = task.error_file(node)
                env = run_env(env_base, el.env, job_id=ctx.job_id, sweep_index=el.index,
                              output_dir=el.output_dir, error_file=error_file)
                name = ctr.container_name(ctx.job_id, el.index, node) if engine != "none" else None
                env.update(watch.node_env(spec, task=task, node=node, container=name))  # stall watch, vitals
                env = dict(sorted({**env, **dist.node_gpu_env(ctx.gpu_count, spec.nodes, procs_per_node, node)}.items()))
                log_dir = task.torchrun_logs(node)
                argv = torchrun_argv(
                    worker_command(el.command, python), launcher=[python, "-m", "torch.distributed.run"],
                    max_restarts=spec.max_restarts, nodes=spec.nodes, node_rank=str(node),
                    procs_per_node=procs_per_node, addr=addresses[0], port=port_text, log_dir=log_dir,
                )
                if name is not None:
                    argv = ctr.run_argv(
                        engine, name=name, image=str(spec.image), workdir=workdir,
                        volumes=ctr.mounts(workdir, ctx.run_dir, el.output_dir),
                        env_names=[*watch.container_env(env), *spec.env_from_host], user=ctr.user_args(engine, ctx.inputs),
                        gpus=ctr.gpu_args(engine, ctx.gpu_count), command=argv,
                        network=net.run_args(net.network_name(ctx.job_id), addresses, node) if subnet else None)
                nodes.append(LocalNode(node, argv, env, workdir, task.log(node), error_file, log_dir,
                                       name))
            elements.append(LocalElement(el.index, el.params, el.output_dir, nodes))
        payload = LocalPayload(ctx.job_id, ctx.run_dir, spec.nodes, procs_per_node, port,
                               spec.section(LocalOptions).stop_on_failure, elements, port_fixed=spec.master_port is not None,
                               container=engine, port_command=list(ctx.port_command), master_addr=addresses[0],
                               gpu_note=dist.shared_gpus_note(ctx.gpu_count, spec.nodes, procs_per_node),
                               threads_note=threads_note(spec, env_base.get("OMP_NUM_THREADS", ""), procs_per_node,
                                                         ctx.cpu_count),
                               # In containers a lost node still ends the run: not brought back there yet.
                               max_losses=spec.recovery.max_losses if engine == "none" else 0)
        if subnet:
            payload.network_name = net.network_name(ctx.job_id)
            payload.network_create = net.create_argv(engine, payload.network_name, subnet, ctx.job_id)
        return Plan("local", ctx.job_id, spec.name, ctx.run_dir, payload, render_local, spec.nodes, procs_per_node,
                    len(elements), port)

    def pick_port(self, busy: set[int]) -> int:
        """A port free on 127.0.0.1 now and not held by another live local job (``busy``)."""
        return ports.pick_port(busy)

    def submit(self, plan: Plan[LocalPayload]) -> LocalHandle:
        payload: LocalPayload = plan.payload
        if payload.port is None:
            raise TargetError("internal: the local plan has no rendezvous port (it is reserved at submit)")
        python = payload.elements[0].nodes[0].argv[0]
        if payload.container != "none":
            import shutil

            if shutil.which(payload.container) is None:
                raise TargetUnavailable(f"{payload.container} is not installed here (local.container: "
                                        f"{payload.container}); on Debian, docker/engine.sh up installs podman")
        elif python == sys.executable:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                raise TargetUnavailable(f"torch is not installed for {python}; the local target runs torchrun: "
                                        "pip install 'ddpjob[train]'")
        import subprocess  # only at submit: render and status never start a process

        from launcher.targets.local.job import secretenv, supervisor

        run_dir = Path(plan.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        folder = RunFolder(run_dir)
        data, secret_values = secretenv.secrets_apart(to_json(payload), plan.masked)
        folder.write_plan(data, plan.render())  # the secret values go in the supervisor's environment
        env = {**{k: v for k, v in os.environ.items() if k != secretenv.SECRET_ENV}, MARKER: plan.job_id,
               **({secretenv.SECRET_ENV: secret_values} if secret_values else {})}
        net.create_job_network(payload.network_create, payload.container, payload.network_name)
        try:
            with open(folder.supervisor_log, "ab") as log:
                proc = subprocess.Popen(
                    supervisor.command(str(run_dir)),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, env=env, cwd=str(run_dir), close_fds=True,
                )
        except BaseException:
            if payload.network_name:  # no supervisor will remove it
                net.remove(payload.container, payload.network_name)
            raise
        return LocalHandle(plan.job_id, str(run_dir), proc.pid, procs.start_time(proc.pid))

    def status(self, handle: LocalHandle) -> JobStatus:
        return job_status(handle)

    def logs(self, handle: LocalHandle, flt: LogFilter, follow: bool = False) -> Iterator[str]:
        from launcher.targets.shared.logtail import LogSource, follow_files

        plan = read_plan(handle.run_dir)
        multi = len(plan.elements) > 1
        srcs = []
        for el in plan.elements:
            if flt.task is not None and el.index != flt.task:
                continue
            for n in el.nodes:
                if flt.node is not None and n.node != flt.node:
                    continue
                label = (f"task{el.index} " if multi else "") + f"node{n.node}"
                srcs.append(LogSource(n.log, label, n.node, plan.procs_per_node, el.index))
        if flt.task is not None and not srcs:
            raise TargetError(f"task {flt.task} does not exist (this job has {len(plan.elements)} task(s))")
        with procs.ExitWaker(handle.pid, handle.start) as waker:  # the supervisor's end wakes us at once
            yield from follow_files(srcs, tail=flt.tail, rank=flt.rank, follow=follow, poll=0.05, sleep=waker.sleep,
                                    finished=lambda: self.status(handle).state.terminal, verbose=flt.verbose)

    def stacks(self, handle: LocalHandle, flt: LogFilter) -> JobStacks:
        """Read by py-spy here: each rank's pid is in its node wrapper's last sample (``watch.json``), checked
        against the process's own RANK before it is read (a rank in a container by its pid as this machine
        sees it: py-spy reads it from outside). The latest task with live ranks, or ``flt.task``."""
        from launcher.targets.shared.health import exit_records, parse
        from launcher.targets.shared.stacks import HOW_TO_GET, JobStacks, RankStack, dump_all, find_py_spy
        from launcher.targets.shared.vitals import ranks_of

        py_spy = find_py_spy()
        if py_spy is None:
            raise TargetUnavailable(HOW_TO_GET)
        files, logs = self.watch_files(handle), self.startup_files(handle)
        for index in [flt.task] if flt.task is not None else reversed(range(len(files))):
            state = read_json(files[index]) if index < len(files) else None
            if not isinstance(state, dict):
                continue
            health = parse(state, index, ends=exit_records(logs[index] if index < len(logs) else []))
            live = [RankStack(n.node, r.rank, r.local_rank, r.pid, n.host) for n in health.nodes if n.ended is None
                    for r in n.ranks if r.state != "X" and r.exit_code is None
                    and flt.node in (None, n.node) and flt.rank in (None, r.rank)]
            if not live:
                continue
            changed = [r for r in live if ranks_of(r.pid)[0] != r.rank]
            for r in changed:
                r.error = "its process is gone or changed since the last sample (the rank restarted?): ask again"
            return JobStacks(index, [*dump_all(py_spy, [r for r in live if r not in changed]), *changed])
        which = f"task {flt.task}" if flt.task is not None else "the job"
        raise TargetError(f"no live rank to read: {which} has not started its workers yet, or has ended "
                          "(ddpjob status ID says which)")

    def cancel_note(self, handle: LocalHandle) -> str | None:
        from launcher.targets.local.job import cgroups

        return cgroups.cancel_note(read_state(handle.run_dir))

    def cancel(self, handle: LocalHandle) -> None:
        """Stop the supervisor and every process carrying the job's marker, whatever the recorded
        state says (a supervisor killed mid-run leaves its agents and workers running)."""
        run_dir = Path(handle.run_dir)
        state = read_state(run_dir)
        if state is not None and state.terminal:
            procs.kill_marked(MARKER, handle.job_id, grace=2.0)  # leftovers of a finished run, if any
            _stop_cgroup(handle, state)
            _remove_containers(handle)
            return
        try:
            atomic_write(RunFolder(run_dir).cancel_requested, str(time.time()))
        except OSError:
            pass  # a full disk: the signals below stop the job all the same
        # The supervisor stops its agents (and their workers) and writes CANCELLED; give it time.
        if procs.alive(handle.pid, handle.start):
            try:
                os.kill(handle.pid, 15)
                os.kill(handle.pid, 18)  # SIGCONT: a stopped supervisor (SIGSTOP, Ctrl-Z) handles it at once
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and procs.alive(handle.pid, handle.start):
                time.sleep(0.1)
        # Whatever is left (a stuck supervisor, a worker that ignored SIGTERM) goes now.
        survivors = procs.kill_marked(MARKER, handle.job_id, grace=2.0) + _stop_cgroup(handle, state)
        if survivors:
            raise TargetError(f"could not stop processes {survivors} of job {handle.job_id}")
        _remove_containers(handle)
        state = read_state(run_dir)
        if state is None or not state.terminal:
            state = state or StateRecord(JobState.CANCELLED.value)
            state.state, state.message, state.ended = JobState.CANCELLED.value, "cancelled by user", time.time()
            write_state(RunFolder(run_dir).state, state)


def _stop_cgroup(handle: LocalHandle, state: StateRecord | None) -> list[int]:
    """Kill what is left in the job's cgroup (launcher.targets.local.job.cgroups): processes that left
    the job's session and environment. Returns those that survived."""
    from launcher.targets.local.job import cgroups

    if state is None or not state.cgroup:
        state = read_state(handle.run_dir)
    path = state.cgroup if state is not None else None
    return cgroups.stop(path) if path is not None and path.endswith(f"/ddpjob-{handle.job_id}") else []


def _remove_containers(handle: LocalHandle) -> None:
    """Stop and remove the job's containers by name (local.container), whatever their state, then
    its network (local.network: bridge)."""
    try:
        plan = read_plan(handle.run_dir)
    except TargetError:
        return
    ctr.remove_job_containers(plan.container, [n.container for el in plan.elements for n in el.nodes if n.container],
                              handle.job_id)
    if plan.network_name and not net.remove(plan.container, plan.network_name):
        raise TargetError(f"could not remove the network {plan.network_name} of job {handle.job_id}: "
                          f"try {plan.container} network rm {plan.network_name}")
