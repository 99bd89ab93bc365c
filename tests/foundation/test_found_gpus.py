"""Ranks and GPUs: one GPU per rank with NCCL, and when ranks must share GPUs (a laptop with one GPU
running the quickstart's two simulated nodes) Gloo over the GPU with a note in the plan, the
trainer's log and the doctor's report, rather than NCCL's "Duplicate GPU detected" failure.

The rule itself is pure (``launcher.train.placement``); the trainer and the doctor's probe run it on
the real GPUs when a GPU machine is lent (docs/performance.md, "On a GPU"); here it is checked as a table, with
the local plan and the doctor's verdict that use it."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.doctor.run import notes, render, verdict
from launcher.spec.load import load_spec
from launcher.targets.base import PlanContext
from launcher.targets.local.target import LocalTarget
from launcher.targets.shared.dist import SHARED_GPUS_ENV as PLAN_ENV
from launcher.train.placement import SHARED_GPUS_ENV, placement, placement_from_env

CTX = PlanContext(job_id="demo-abcde", run_dir="/home/u/.ddpjob/runs/demo-abcde", port=29501, cpu_count=4,
                  gpu_count=0, home="/home/u", cwd="/work/proj", python="/usr/bin/python3")


@pytest.mark.parametrize(("gpus", "local_rank", "local_world", "elsewhere", "backend", "index", "noted"), [
    (0, 0, 1, False, "gloo", None, False),    # CPU only
    (0, 1, 2, True, "gloo", None, False),     # CPU only: nothing is shared
    (1, 0, 1, False, "nccl", 0, False),       # one rank, one GPU
    (8, 5, 8, False, "nccl", 5, False),       # a full node
    (1, 1, 2, False, "gloo", 0, True),        # two ranks on one GPU: round-robin, gloo
    (2, 2, 3, False, "gloo", 0, True),
    (1, 0, 1, True, "gloo", 0, True),         # another simulated node uses the same GPU
])
def test_one_gpu_per_rank_with_nccl_else_gloo_with_a_note(gpus, local_rank, local_world, elsewhere, backend, index,
                                                          noted):
    p = placement(gpus, local_rank, local_world, shared_elsewhere=elsewhere)
    assert (p.backend, p.device_index, p.note is not None) == (backend, index, noted)
    if noted:
        assert "NCCL takes one rank per GPU" in str(p.note) and "gloo" in str(p.note)
        assert (f"{local_world} ranks on this node share its {gpus} GPU(s)" in str(p.note)) == (local_world > gpus)
        assert ("other simulated nodes" in str(p.note)) == elsewhere


def test_the_plan_and_the_trainer_agree_on_the_variable():
    assert PLAN_ENV == SHARED_GPUS_ENV == "DDPJOB_GPUS_SHARED"


def test_a_rank_reads_its_place_from_torchruns_env_and_the_plans_flag():
    assert placement_from_env(1, {}) == placement(1, 0, 1)
    assert placement_from_env(2, {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}) == placement(2, 3, 4)
    assert placement_from_env(1, {SHARED_GPUS_ENV: "1"}).backend == "gloo"
    assert placement_from_env(1, {SHARED_GPUS_ENV: "0"}).backend == "nccl"


def _plan(gpus: int, nodes: int, procs: int | str = "auto"):
    loaded = load_spec(None, base={"name": "demo", "workdir": "/work/proj", "nodes": nodes, "procs_per_node": procs,
                                   "command": ["python", "train.py"]})
    return LocalTarget().plan(loaded, dataclasses.replace(CTX, gpu_count=gpus))


def test_simulated_nodes_get_their_own_gpus_when_there_are_enough():
    plan = _plan(gpus=4, nodes=2)
    envs = [n.env for n in plan.payload.elements[0].nodes]
    assert plan.procs_per_node == 2 and [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert all(SHARED_GPUS_ENV not in e for e in envs) and "share" not in plan.render()


def test_simulated_nodes_sharing_one_gpu_are_told_and_the_plan_says_why():
    plan = _plan(gpus=1, nodes=2)  # the quickstart on a laptop with one GPU
    envs = [n.env for n in plan.payload.elements[0].nodes]
    assert plan.procs_per_node == 1 and all(e[SHARED_GPUS_ENV] == "1" for e in envs)
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in envs)
    text = plan.render()
    assert "# note: 2 ranks share this machine's 1 GPU(s): NCCL takes one rank per GPU" in text, text
    assert f"{SHARED_GPUS_ENV}=1" in text
    one = _plan(gpus=1, nodes=1, procs=2)  # one node's own ranks: the trainer sees LOCAL_WORLD_SIZE itself
    assert SHARED_GPUS_ENV not in one.payload.elements[0].nodes[0].env and "2 ranks share" in one.render()
    cpu = _plan(gpus=0, nodes=2)
    assert all(SHARED_GPUS_ENV not in n.env for n in cpu.payload.elements[0].nodes) and "note:" not in cpu.render()


def _report(world: int, note: str | None = None, device: str | None = None) -> dict[str, object]:
    ranks = [{"rank": i, "local_rank": 0, "host": "h", "address": "127.0.0.1", "env": {}, "backend": "gloo",
              "gpus": ["NVIDIA H100 80GB HBM3"], "device": device, "note": note} for i in range(world)]
    results = [{"bytes": 2**20, "iters": 3, "time_us": 10.0, "algbw_gbps": 100.0,
                "busbw_gbps": 100.0 * 2 * (world - 1) / world}]
    return {"world_size": world, "ranks": ranks, "results": results}


def test_doctor_with_one_rank_says_why_busbw_is_zero_instead_of_warning():
    one = _report(1, device="cuda:0")
    assert verdict(one) == []
    assert any("with 1 rank nothing crosses a link" in n for n in notes(one))
    assert ", uses cuda:0" in "\n".join(render(one, []))
    broken = _report(2)
    broken["results"][0]["busbw_gbps"] = 0.0  # type: ignore[index]
    assert verdict(broken) == ["an all-reduce measured no bandwidth"]


def test_doctor_says_nccl_was_not_checked_when_ranks_share_gpus():
    note = placement(1, 0, 1, shared_elsewhere=True).note
    warnings = verdict(_report(2, note=note, device="cuda:0"))
    assert len(warnings) == 1 and "NCCL was not checked" in warnings[0] and "--nodes 1" in warnings[0]
