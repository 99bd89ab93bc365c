"""The front door: fast imports, helpful --help, clear errors for command-line mistakes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_cli_import_loads_no_heavy_library():
    from testkit import start_up_modules

    assert [m for m in ("torch", "kubernetes", "submitit", "pydantic", "yaml") if m in start_up_modules()] == []


def test_help_pays_for_click_only():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom launcher.cli.main import cli\n"
            "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "print([m for m in ('torch', 'kubernetes', 'submitit', 'pydantic', "
            "'launcher.core.stepsplit') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # the step split (results, status) is loaded by the commands that show it


def test_a_local_jobs_own_processes_start_light():
    """The supervisor and the node wrapper stand between ``submit`` and torchrun: they run without
    ``site`` (-I -S), and importing them loads none of the modules their quick start avoids."""
    from pathlib import Path

    from launcher.targets.local.job import node, supervisor

    root = str(Path(supervisor.__file__).resolve().parents[4])
    argv = supervisor.command("/run/dir")
    assert argv[:4] == [sys.executable, "-I", "-S", "-c"] and argv[-2:] == [root, "/run/dir"]
    wrapper = node.command(sys.executable, "/run/dir/n.exit.json", ["torchrun"])
    assert wrapper[:3] == [sys.executable, "-I", "-S"] and Path(wrapper[3]).is_file()
    avoided = ("dataclasses", "pathlib", "json", "launcher.targets.base", "launcher.targets.local.target")
    code = (f"import sys; sys.path.insert(0, {root!r}); import launcher.targets.local.job.supervisor; "
            f"print([m for m in {avoided!r} if m in sys.modules])")
    # -B: as the rest of the tests, no bytecode written into the checkout (-I ignores PYTHONDONTWRITEBYTECODE)
    out = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    # The node wrapper runs by path (no package import): nothing but the few standard modules it names.
    out = subprocess.run([sys.executable, "-I", "-S", "-B", "-X", "importtime", wrapper[3]], capture_output=True,
                         text=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert out.returncode == 2 and not loaded & {*avoided, "subprocess", "typing"}, loaded


def test_what_the_supervisor_imports_on_its_rarer_ways_needs_no_site_packages():
    """Stopping a failed run's other nodes, the supervisor imports the local payload (its marker) and with
    it the container module: all without ``site`` (no pydantic), where it runs. A spec section imported at
    their top (the targets' sections are pydantic models) ended every failed run with the supervisor gone."""
    from pathlib import Path

    from launcher.targets.local.job import supervisor

    root = str(Path(supervisor.__file__).resolve().parents[4])
    code = (f"import sys; sys.path.insert(0, {root!r}); import launcher.targets.local.payload, "
            "launcher.targets.local.portmove; print('pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def _plan_of_plain_processes(tmp_path, script: str, elements: int = 2):
    """A local plan whose nodes are plain Python processes (not torchrun), written as submit would."""
    from launcher.targets.local.target import LocalElement, LocalNode, LocalPayload
    from launcher.targets.shared.files import to_json, write_json

    run_dir = tmp_path / "home" / "runs" / "plain-abcde"
    nodes_cwd = tmp_path / "work"
    nodes_cwd.mkdir(parents=True)
    payload = LocalPayload(
        job_id="plain-abcde", run_dir=str(run_dir), nodes=2, procs_per_node=1, port=29999, stop_on_failure=True,
        elements=[LocalElement(index=i, params={"i": str(i)}, output_dir=str(run_dir / "output" / str(i)), nodes=[
            LocalNode(node=n, argv=[sys.executable, "-c", script, str(i), str(n)], env={"NODE_SAYS": f"t{i}n{n}"},
                      cwd=str(nodes_cwd), log=str(run_dir / f"task-{i}" / f"node-{n}.log"),
                      error_file=str(run_dir / f"task-{i}" / f"node-{n}.error.json"),
                      torchrun_log_dir=str(run_dir / f"task-{i}" / f"torchrun-node-{n}")) for n in range(2)])
                  for i in range(elements)])
    run_dir.mkdir(parents=True)
    write_json(run_dir / "plan.json", to_json(payload))
    return run_dir, nodes_cwd


def test_the_supervisor_runs_a_job_without_its_heavy_modules(tmp_path):
    """On a job's ordinary way (a two-run sweep to SUCCEEDED) the supervisor never loads the typed
    plan, dataclasses, pathlib or subprocess: their CPU would be taken from the agents
    importing torch beside it. Its nodes still start in their directory, with their environment,
    their output in their log and nothing on stdin."""
    from pathlib import Path

    from launcher.targets.local.job import supervisor

    script = "import os, sys; print(os.getcwd(), os.environ['NODE_SAYS'], repr(sys.stdin.read()), sys.argv[1:])"
    run_dir, nodes_cwd = _plan_of_plain_processes(tmp_path, script)
    root = str(Path(supervisor.__file__).resolve().parents[4])
    avoided = ("dataclasses", "pathlib", "subprocess", "launcher.targets.base",
               "launcher.targets.local.target")
    code = (f"import sys; sys.path.insert(0, {root!r}); from launcher.targets.local.job import supervisor; "
            f"code = supervisor.main([{str(run_dir)!r}], from_submit=True); print(code, [m for m in {avoided!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=run_dir, stdin=subprocess.PIPE)
    assert out.stdout.strip() == "0 []", (out.stdout, out.stderr)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "SUCCEEDED" and [e["state"] for e in state["elements"]] == ["SUCCEEDED"] * 2
    for i in range(2):
        for n in range(2):
            log = (run_dir / f"task-{i}" / f"node-{n}.log").read_text()
            assert log == f"{nodes_cwd} t{i}n{n} '' ['{i}', '{n}']\n", log


def test_the_supervisors_plan_reader_agrees_with_the_typed_one(tmp_path):
    """Started by submit, the supervisor reads the plan.json submit just wrote without the typed
    dataclasses, and every field of the typed plan reads the same; started by hand (or on a plan
    this ddpjob did not write) it reads through the typed reader, defaults and errors included."""
    import dataclasses

    from launcher.targets.local.job import supervisor
    from launcher.targets.local.target import read_plan

    def same(typed, light):
        for f in dataclasses.fields(typed):
            value = getattr(typed, f.name)
            if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                assert len(value) == len(getattr(light, f.name))
                for a, b in zip(value, getattr(light, f.name)):
                    same(a, b)
            else:
                assert getattr(light, f.name) == value, f.name

    run_dir, _ = _plan_of_plain_processes(tmp_path, "pass")
    quick = supervisor.read_plan(str(run_dir), from_submit=True)
    same(read_plan(str(run_dir)), quick)
    assert not dataclasses.is_dataclass(quick) and isinstance(quick.elements[0].nodes[0].env, dict)
    assert dataclasses.is_dataclass(supervisor.read_plan(str(run_dir)))
    data = json.loads((run_dir / "plan.json").read_text())
    del data["port_fixed"], data["container"], data["elements"][1]["nodes"][0]["container"]
    (run_dir / "plan.json").write_text(json.dumps(data))
    same(read_plan(str(run_dir)), supervisor.read_plan(str(run_dir)))
    del data["elements"][0]["nodes"][0]["argv"]
    (run_dir / "plan.json").write_text(json.dumps(data))
    errors = []
    for reader in (read_plan, supervisor.read_plan):  # not this ddpjob's plan: the typed reader's answer
        with pytest.raises(TypeError) as e:
            reader(str(run_dir))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "argv" in errors[0]
    (run_dir / "plan.json").write_text("{")  # unreadable even when submit wrote it: the typed reader says why
    with pytest.raises(Exception) as e:
        supervisor.read_plan(str(run_dir), from_submit=True)
    assert "plan.json" in str(e.value)


def test_every_command_has_help_with_an_example(cli):
    for verb in ["submit", "render", "validate", "schema", "status", "list", "logs", "cancel", "wait"]:
        proc = cli(verb, "--help")
        assert proc.returncode == 0 and "Usage: ddpjob " + verb in proc.stdout
    assert "Example" in cli("submit", "--help").stdout
    assert "--dry-run" in cli("submit", "--help").stdout


def test_dry_run_prints_the_plan_and_records_nothing(cli, ddpjob_home):
    proc = cli("submit", "jobs/quickstart.yaml", "--nodes", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("--node-rank") == 3 and "--nnodes 3" in proc.stdout
    assert json.loads(cli("list", "-o", "json").stdout) == []
    render = cli("render", "jobs/quickstart.yaml", "--target", "local", "--set", "nccl.debug=INFO")
    assert render.returncode == 0 and "NCCL_DEBUG=INFO" in render.stdout


def test_command_line_mistakes(cli):
    none = cli("submit")
    assert none.returncode == 2 and "give a spec file" in none.stderr
    extra = cli("submit", "jobs/quickstart.yaml", "oops")
    assert extra.returncode == 2 and "extra arguments" in extra.stderr
    bad_target = cli("submit", "jobs/quickstart.yaml", "--target", "mars")
    assert bad_target.returncode == 2 and "mars" in bad_target.stderr
    for proc in (none, extra, bad_target):
        assert "Traceback" not in proc.stderr


@pytest.mark.real
def test_cancel_task_is_refused_where_unsupported(cli, tmp_path):
    (tmp_path / "s.py").write_text("import time; time.sleep(60)\n")
    job_id = cli("submit", "-q", "--", "python", "s.py", cwd=tmp_path).stdout.strip()
    proc = cli("cancel", job_id, "--task", "0")
    assert proc.returncode == 2 and "--task is not supported by the local target" in proc.stderr
    assert cli("cancel", job_id).returncode == 0


def test_render_skips_pydantic_plugin_discovery_but_the_api_does_not():
    """The ``ddpjob`` process tells pydantic it has no plugins (the entry-point scan and
    importlib.metadata cost ~30 ms of every render); code importing ``launcher.api`` inside a user's
    program keeps pydantic's plugins."""
    render = ("import sys\nsys.argv = ['ddpjob', 'render', 'jobs/quickstart.yaml', '--target', 'k8s']\n"
              "from launcher.cli.entry import main\ntry:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None)\n"
              "print('METADATA', 'importlib.metadata' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", render], capture_output=True, text=True)
    assert proc.returncode == 0 and "kind: PyTorchJob" in proc.stdout, proc.stderr
    assert "METADATA False" in proc.stderr
    api = ("import sys, launcher.api\nfrom pydantic import BaseModel\nclass M(BaseModel):\n    a: int = 1\n"
           "print(sys.modules['pydantic.plugin._loader'].__file__, 'importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", api], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split()[0].endswith("_loader.py") and out.stdout.split()[1] == "True", out


@pytest.mark.parametrize("args", [
    ["prune", "--state", "failed", "--dry-run"], ["prune", "--state", "Cancelled", "--older-than", "0", "--dry-run"],
    ["list", "--state", "RUNNING", "-o", "JSON"], ["list", "--target", "LOCAL"], ["cancel", "--all", "--state", "running", "--yes"],
    ["render", "jobs/quickstart.yaml", "--target", "Local"], ["config", "show", "-o", "Json"],
])
def test_states_targets_and_formats_take_any_case(cli, args):
    """Issue 45, item 5: `prune --state failed` was refused while `list --state` took lowercase."""
    proc = cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_validate_takes_the_overrides_the_readme_says_it_does(cli):
    """Issue 45, item 3: "Overrides apply before validation: --nodes, --procs-per-node, --name and --set"."""
    ok = cli("validate", "jobs/quickstart.yaml", "--nodes", "3", "-p", "2", "--name", "other", "--set", "resources.cpus=4")
    assert ok.returncode == 0 and "jobs/quickstart.yaml: ok (3 node(s), 1 task(s))" in ok.stdout, ok.stdout + ok.stderr
    bad = cli("validate", "jobs/quickstart.yaml", "jobs/linreg.yaml", "--set", "recovery.max_losses=-1")
    assert bad.returncode == 2 and bad.stderr.count("recovery.max_losses: ") == 2, bad.stderr
