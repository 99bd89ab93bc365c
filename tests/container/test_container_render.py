"""The containerised local plan (``local.container``) without an engine: the exact engine command
lines (a golden file), what each container gets, and the spec problems refused at file:line:field.
DDPJOB_UPDATE_GOLDEN=1 rewrites the golden file."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from goldens import assert_golden

from launcher.core.errors import SpecError
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.local.container import LocalInputs
from launcher.targets.local.target import LocalTarget

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CTX = PlanContext(job_id="demo-abcde", run_dir="/home/u/.ddpjob/runs/demo-abcde", port=29501, cpu_count=4,
                  gpu_count=0, home="/home/u", cwd="/work/proj", python="/usr/bin/python3",
                  inputs=LocalInputs(uid=0, gid=0))


def spec(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "demo", "workdir": "/work/proj", "nodes": 2, "image": "localhost/ddpjob-train:cpu",
        "command": ["python", "train.py", "--lr", "{lr}", "--note", "$(touch /tmp/pwned); echo 'x' `id`"],
        "env": {"NOTE": "a b;c", "API_TOKEN": "s3cr3t-value"}, "local": {"container": "podman"},
        "sweep": {"lr": [0.1, 0.01]},
    }
    base.update(extra)
    return base


def node_command(text: str, node: int) -> list[str]:
    """The shell words of node ``node``'s block in the rendered text (continuation lines joined)."""
    block = text.split(f"# node {node} -> ")[1].split("\n# node ")[0]
    words = shlex.split(block.split("\n", 1)[1].replace("\\\n", " "))
    assert words[0] == "(cd" and words[2] == "&&" and words[3] == "env"
    words[-1] = words[-1].removesuffix(")")
    first = next(i for i, w in enumerate(words) if w in ("podman", "docker"))
    return words[first:]


def test_golden_podman_plan_is_the_exact_command_line():
    loaded = load_spec(None, base=spec(output_dir="/data/out/{job_id}"))
    plan = LocalTarget().plan(loaded, CTX)
    text = plan.render()
    assert_golden(GOLDEN / "local_podman.txt", text)
    node = plan.payload.elements[1].nodes[1]
    assert node_command(text.split("## task 1")[1], 1) == node.argv  # render == what the supervisor runs
    argv = node.argv
    image_at = argv.index("localhost/ddpjob-train:cpu")
    opts = argv[:image_at]
    assert opts[:4] == ["podman", "run", "--rm", "--init"]
    assert "--network=host" in opts and "--ipc=host" in opts
    assert opts[opts.index("--name") + 1] == "ddpjob-demo-abcde-1-1" == node.container
    assert opts[opts.index("--user") + 1] == "0:0" and opts[opts.index("--workdir") + 1] == "/work/proj"
    volumes = [opts[i + 1] for i, w in enumerate(opts) if w == "--volume"]
    assert volumes == ["/work/proj:/work/proj", "/home/u/.ddpjob/runs/demo-abcde:/home/u/.ddpjob/runs/demo-abcde",
                       "/data/out/demo-abcde/sweep-1:/data/out/demo-abcde/sweep-1"]
    # Every variable of the node passes by name only: no value (a secret) is on the command line; the
    # stall watch's is the node wrapper's own, outside the container.
    assert [opts[i + 1] for i, w in enumerate(opts) if w == "--env"] == [n for n in node.env if n != "DDPJOB_WATCH"]
    assert node.env["DDPJOB_WATCH"].endswith(" container=ddpjob-demo-abcde-1-1")
    assert not any("s3cr3t" in w or "a b;c" in w for w in argv)
    assert argv[image_at + 1 : image_at + 5] == ["sh", "-c", 'umask 077 && exec "$@"', "sh"]
    torchrun = argv[image_at + 5 :]
    assert torchrun[:3] == ["python", "-m", "torch.distributed.run"]
    assert torchrun[-1] == "$$(touch /tmp/pwned); echo 'x' `id`"  # $ doubled for torchrun, as without containers


def test_shown_plan_masks_secrets_and_names_host_env(cli, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\nimage: localhost/ddpjob-train:cpu\ncommand: [python, -m, launcher.train]\n"
                         "env: {API_TOKEN: s3cr3t-value}\nenv_from_host: [HOST_VALUE]\nlocal: {container: podman}\n")
    proc = cli("render", str(spec_file), "--target", "local", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "s3cr3t" not in proc.stdout and "API_TOKEN='***'" in proc.stdout
    assert "--env HOST_VALUE" in proc.stdout and "--env API_TOKEN" in proc.stdout
    assert f"--volume {tmp_path}:{tmp_path}" in proc.stdout
    dry = cli("submit", str(spec_file), "--target", "local", "--dry-run", cwd=tmp_path, env={"HOST_VALUE": "x"})
    assert dry.returncode == 0 and dry.stdout == proc.stdout  # render and --dry-run: the same plan


@pytest.mark.parametrize("engine,inputs,gpus,expected", [
    ("podman", LocalInputs(0, 0), 0, ["--user", "0:0"]),
    ("podman", LocalInputs(1000, 1000), 0, ["--userns=keep-id"]),  # rootless podman: the user's own uid
    ("docker", LocalInputs(1000, 1001), 0, ["--user", "1000:1001"]),
    ("docker", LocalInputs(0, 0), 2, ["--user", "0:0", "--gpus", "all"]),
    ("podman", LocalInputs(0, 0), 2, ["--user", "0:0", "--device", "nvidia.com/gpu=all"]),
])
def test_user_and_gpus_per_engine(engine, inputs, gpus, expected):
    loaded = load_spec(None, base=spec(local={"container": engine}, procs_per_node=1))
    plan = LocalTarget().plan(loaded, dataclasses.replace(CTX, inputs=inputs, gpu_count=gpus))
    argv = plan.payload.elements[0].nodes[1].argv
    opts = argv[argv.index("--ipc=host") + 1 : argv.index("--volume")]
    assert argv[0] == engine and opts == expected
    if gpus:  # each simulated node still sees only its own GPU
        assert plan.payload.elements[0].nodes[1].env["CUDA_VISIBLE_DEVICES"] == "1"


def test_no_container_plan_is_unchanged():
    loaded = load_spec(None, base=spec(local={}))
    plan = LocalTarget().plan(loaded, CTX)
    assert plan.payload.container == "none" and plan.payload.elements[0].nodes[0].container is None
    assert plan.payload.elements[0].nodes[0].argv[0] == "/usr/bin/python3"
    assert "podman" not in plan.render() and "container" not in plan.render()


def issues_of(base: dict[str, object]) -> list[tuple[tuple[object, ...], str]]:
    loaded = load_spec(None, base=base)
    with pytest.raises(SpecError) as err:
        LocalTarget().plan(loaded, CTX)
    return [(i.path, i.message) for i in err.value.issues]


@pytest.mark.parametrize("change,field,words", [
    ({"image": None}, ("local", "container"), "needs an image"),
    ({"image": "--privileged"}, ("image",), "image reference"),
    ({"image": "-v/etc:/x"}, ("image",), "image reference"),
    ({"image": "img; rm -rf /"}, ("image",), "image reference"),
    ({"workdir": "/"}, ("workdir",), "would hide the image"),
    ({"workdir": "/opt"}, ("workdir",), "would hide the image"),
    ({"workdir": "/usr/lib/x"}, ("workdir",), "would hide the image"),
    ({"workdir": "/work/a:b"}, ("workdir",), "':' or ','"),
    ({"output_dir": "/data/x,y"}, ("output_dir",), "':' or ','"),
])
def test_refused_in_plan(change, field, words):
    issues = issues_of(spec(**change))
    assert any(path == field and words in msg for path, msg in issues), issues


def test_cli_refusals_point_at_file_line_field(cli, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\ncommand: [python, train.py]\nimage: --privileged\nlocal:\n  container: podman\n")
    (tmp_path / "train.py").write_text("")
    proc = cli("submit", str(spec_file), "--target", "local", cwd=tmp_path)
    assert proc.returncode == 2 and f"{spec_file}:3" in proc.stderr and "image" in proc.stderr, proc.stderr
    proc = cli("submit", str(spec_file), "--target", "local", "--set", "local.container=lxc", cwd=tmp_path)
    assert proc.returncode == 2 and "local.container" in proc.stderr, proc.stderr
    assert cli("list", "-o", "json").stdout.strip() in ("", "[]")  # nothing was submitted


def test_submit_without_the_engine_is_exit_3_and_leaves_no_job(cli, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\ncommand: [python, train.py]\nimage: localhost/x\nlocal: {container: podman}\n")
    (tmp_path / "train.py").write_text("")
    proc = cli("submit", str(spec_file), "--target", "local", cwd=tmp_path, env={"PATH": str(tmp_path / "none")})
    assert proc.returncode == 3 and "podman is not installed" in proc.stderr, proc.stderr
    assert cli("list", "-o", "json").stdout.strip() in ("", "[]")


def test_preflight_checks_scripts_not_image_modules(cli, tmp_path):
    """A module may live only in the image; a script must be in the mounted working directory."""
    ctx = dataclasses.replace(CTX, cwd=str(tmp_path))
    module = {"name": "demo", "command": ["python", "-m", "only_in_the_image"], "image": "localhost/x"}
    assert LocalTarget().preflight(load_spec(None, base={**module, "local": {"container": "podman"}}), ctx) == []
    assert LocalTarget().preflight(load_spec(None, base=module), ctx)  # without a container: refused
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\ncommand: [python, missing.py]\nimage: localhost/x\nlocal: {container: podman}\n")
    proc = cli("submit", str(spec_file), "--target", "local", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.py does not exist" in proc.stderr, proc.stderr
    assert cli("list", "-o", "json").stdout.strip() in ("", "[]")
