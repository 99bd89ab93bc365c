"""slurm.container.runtime oci and podman without a cluster: golden renders (the sbatch script, the
OCI bundle's config.json, podman's task epilog), the spec errors, and task_env's table."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from goldens import assert_golden

from launcher.core.errors import SpecError
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.shared.container import LocalInputs
from launcher.targets.slurm.container import ContainerInputs
from launcher.targets.slurm.job.task_env import task_variables
from launcher.targets.slurm.target import SlurmTarget

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
IMAGE_ENV = ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "VIRTUAL_ENV=/opt/venv"]
INPUTS = ContainerInputs(LocalInputs(1000, 1000), image_id="sha256:77f023bfed527794af2304def6fe94a919e65afe", env=IMAGE_ENV)
CTX = PlanContext(job_id="demo-abcde", run_dir="/home/u/.ddpjob/runs/demo-abcde", cpu_count=4, home="/home/u",
                  cwd="/work/proj", python="/usr/bin/python3", inputs=INPUTS)


def plan_of(sets: list[str], ctx: PlanContext = CTX, base: dict | None = None):  # type: ignore[type-arg]
    loaded = load_spec(None if base else REPO / "jobs/quickstart.yaml",
                       overrides=["workdir=/work/proj", "image=localhost/ddpjob-train:cpu", *sets], base=base)
    return SlurmTarget().plan(loaded, ctx)


def srun_line(script: str) -> list[str]:
    return shlex.split(next(ln for ln in script.splitlines() if ln.startswith("srun ")))


def test_golden_oci():
    plan = plan_of(["slurm.container.runtime=oci", "procs_per_node=2", "slurm.container.mounts=[/data:/data:ro]"])
    assert_golden(GOLDEN / "slurm_oci.txt", plan.render())
    argv = srun_line(plan.payload.script)
    bundle = plan.payload.oci
    # One bundle per image and config.json: the image's short id, then the config's digest.
    assert f"--container={bundle.path}" in argv and bundle.path.startswith("/home/u/.ddpjob/slurm/oci/77f023bfed52-")
    assert bundle.base == "/home/u/.ddpjob/slurm/oci/77f023bfed52" and bundle.image == "localhost/ddpjob-train:cpu"
    # The image's PATH wins over the submitting shell's; task_env sets the per-task variables first.
    i = argv.index("env")
    assert argv[i:i + 6] == ["env", f"{IMAGE_ENV[0]}", "python3", "-m", "launcher.targets.slurm.job.task_env", "-u"]
    # Before it, each task checks that it runs in the bundle (a Slurm without oci.conf runs it on the node).
    check = f"{plan.payload.common.job_dir}/oci-check.sh"
    assert argv[i - 2:i] == ["sh", check] and 'DDPJOB_OCI_IMAGE:-}" ] && exec "$@"' in plan.payload.files[check]
    config = json.loads(bundle.config)
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert config["process"]["user"] == {"uid": 1000, "gid": 1000, "umask": 0o77} and config["process"]["env"] == [
        *IMAGE_ENV, "DDPJOB_OCI_IMAGE=sha256:77f023bfed527794af2304def6fe94a919e65afe"]
    assert [n["type"] for n in config["linux"]["namespaces"]] == ["mount", "user"]  # no network, PID, IPC or UTS
    binds = {m["destination"]: (m["source"], m["options"][-1]) for m in config["mounts"] if m["type"] == "bind"}
    assert binds["/home/u/.ddpjob/slurm"] == ("/home/u/.ddpjob/slurm", "rw") and binds["/work/proj"][1] == "rw"
    assert binds["/data"] == ("/data", "ro") and binds["/etc/hosts"] == ("/etc/hosts", "ro")
    # The same spec again: the same bundle (reused); another working directory: another one.
    assert plan_of(["slurm.container.runtime=oci", "procs_per_node=2",
                    "slurm.container.mounts=[/data:/data:ro]"]).payload.oci.path == bundle.path
    assert plan_of(["slurm.container.runtime=oci", "procs_per_node=2", "workdir=/work/other"]).payload.oci.path != bundle.path


def test_oci_as_root_has_no_user_namespace_and_render_without_the_image_says_so():
    plan = plan_of(["slurm.container.runtime=oci"], dataclasses.replace(
        CTX, inputs=ContainerInputs(LocalInputs(0, 0), problem="podman has no image here")))
    config = json.loads(plan.payload.oci.config)
    assert [n["type"] for n in config["linux"]["namespaces"]] == ["mount"] and "uidMappings" not in config["linux"]
    text = plan.render()
    assert "the image could not be inspected here: id and PATH are placeholders" in text
    argv = srun_line(plan.payload.script)
    assert f"--container={plan.payload.oci.path}" in argv and plan.payload.oci.path.startswith("/home/u/.ddpjob/slurm/oci/<image id>-")
    assert "PATH=<the image's PATH>" in argv


def test_golden_podman():
    plan = plan_of(["slurm.container.runtime=podman", "procs_per_node=2", "env_from_host=[API_TOKEN]"])
    assert_golden(GOLDEN / "slurm_podman.txt", plan.render())
    argv = srun_line(plan.payload.script)
    epilog = "/home/u/.ddpjob/slurm/demo-abcde/podman-epilog.sh"
    assert f"--task-epilog={epilog}" in argv
    sh = argv[argv.index("sh"):]
    assert sh[:2] == ["sh", "-c"] and sh[3:5] == ["sh", "python3"]
    inner = shlex.split(sh[2])
    assert inner[:3] == ["exec", "podman", "run"] and inner[-1] == "$@"
    # Named per run and node at run time (sh expands it), as the epilog that removes it.
    assert '--name ddpjob-demo-abcde-0-"$SLURM_NODEID"' in sh[2]
    assert 'ddpjob-demo-abcde-0-"$SLURM_NODEID"' in plan.payload.files[epilog]
    # Variables by name only (no value on a command line), the user's ids, the folders at the same paths.
    envs = [inner[i + 1] for i, a in enumerate(inner) if a == "--env"]
    assert envs == ["SLURM_*", "SUBMITIT_*", "DDPJOB_*", "CUDA_VISIBLE_DEVICES", "API_TOKEN"]
    assert "--userns=keep-id" in inner and "--network=host" in inner and "--ipc=host" in inner
    vols = [inner[i + 1] for i, a in enumerate(inner) if a == "--volume"]
    assert vols == ["/home/u/.ddpjob/slurm:/home/u/.ddpjob/slurm", "/work/proj:/work/proj"]


def test_podman_array_names_each_run():
    plan = plan_of(["slurm.container.runtime=podman", "sweep={seed: [1, 2]}", "env={SEED: '{seed}'}"])
    script = plan.payload.script
    argv = srun_line(script)
    assert '--name ddpjob-demo-abcde-"$SLURM_ARRAY_TASK_ID"-"$SLURM_NODEID"' in argv[argv.index("-c") + 1]
    assert 'ddpjob-demo-abcde-"${SLURM_ARRAY_TASK_ID:-0}"-"$SLURM_NODEID"' in next(iter(plan.payload.files.values()))


@pytest.mark.parametrize(("sets", "field", "words"), [
    (["slurm.container.runtime=oci", "image=null"], "slurm.container.image", "needs an image or a bundle"),
    (["slurm.container.runtime=podman", "image=null"], "slurm.container.image", "needs an image"),
    (["slurm.container.runtime=podman", "slurm.container.bundle=/b"], "slurm.container.bundle", "for runtime oci"),
    (["slurm.container.runtime=oci", "slurm.container.bundle=rel/b"], "slurm.container.bundle", "absolute path"),
    (["slurm.container.runtime=podman", "workdir=/usr/src"], "workdir", "hide the image's own system"),
])
def test_container_spec_errors(sets, field, words):
    with pytest.raises(SpecError) as e:
        plan_of(sets)
    text = e.value.render()
    assert field in text and words in text, text


def test_named_bundle_must_mount_the_folders():
    inputs = ContainerInputs(LocalInputs(0, 0), image_id="bundle", env=IMAGE_ENV, bundle_mounts=["/proc", "/work"])
    with pytest.raises(SpecError) as e:
        plan_of(["slurm.container.runtime=oci", "slurm.container.bundle=/b"], dataclasses.replace(CTX, inputs=inputs))
    assert "does not mount /home/u/.ddpjob/slurm" in e.value.render()
    inputs.bundle_mounts.append("/home/u")
    plan = plan_of(["slurm.container.runtime=oci", "slurm.container.bundle=/b"], dataclasses.replace(CTX, inputs=inputs))
    assert "--container=/b" in srun_line(plan.payload.script) and plan.payload.oci.image is None


@pytest.mark.parametrize(("host", "expect"), [
    ("n1", {"SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}),
    ("n2.cluster.local", {"SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}),
])
def test_task_env_sets_the_task_from_the_hostname(host, expect):
    # What Slurm 22.05 leaves in an OCI container: the batch script's zeros.
    env = {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_PROCID": "0", "SLURM_NODEID": "0"}
    assert task_variables(env, host) == expect


def test_task_env_refuses_an_unknown_host():
    with pytest.raises(LookupError, match="node names must be the hosts' names"):
        task_variables({"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]"}, "login1")
