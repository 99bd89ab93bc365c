"""The trainer under real torchrun and gloo: exact evaluation, convergence, restarts, preemption, determinism."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dist_workers
import pytest
import torch
import torch.multiprocessing as mp
from testkit import wait_for

from launcher.train import checkpoint

pytestmark = pytest.mark.real  # torchrun and gloo process groups

SMALL = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "2048", "--eval-size", "101",
         "--batch-size", "64", "--epochs", "2", "--lr", "0.05", "--log-every", "1"]


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []





def finish(p: subprocess.Popen, timeout=300) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out
    return out


def test_two_node_resnet18_eval_equals_one_process_evaluating_its_checkpoint(cli, tiny_cifar, tmp_path):
    # ResNet-18's BatchNorm running statistics differ between ranks after DDP steps; the distributed
    # evaluation must still score rank 0's model, the one in the checkpoint.
    spec = tmp_path / "cifar.yaml"
    out = tmp_path / "out"
    spec.write_text(f"""
name: tiny-cifar
command: [python, -m, launcher.train, --dataset, cifar10, --data-dir, "{tiny_cifar}", --model, resnet18,
          --epochs, 1, --batch-size, 8, --max-steps, 4, --checkpoint-every, 3, --eval-batch-size, 16,
          --output-dir, "{out}"]
nodes: 2
""")
    proc = cli("submit", str(spec), "-f")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4 and summary["eval_samples"] == 51  # 51 = 2 * 25 + 1
    single = subprocess.run([sys.executable, "-m", "launcher.train", "--eval-only", "--resume", str(out / "checkpoint.pt"),
                             "--dataset", "cifar10", "--data-dir", str(tiny_cifar), "--eval-batch-size", "7",
                             "--output-dir", str(tmp_path / "eval")], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stdout + single.stderr
    ev = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert ev["world_size"] == 1 and ev["eval_samples"] == 51 and ev["model"] == "resnet18" and ev["steps"] == 4
    assert ev["eval_accuracy"] == summary["eval_accuracy"]
    assert abs(ev["eval_loss"] - summary["eval_loss"]) < 1e-4, (ev["eval_loss"], summary["eval_loss"])
    logs = cli("logs", proc.stdout.split()[1]).stdout
    assert "[node0 rank0] rank 0/2" in logs and "[node1 rank1] rank 1/2" in logs


def test_no_sync_accumulation_at_world_size_2(tmp_path):
    # Real gloo processes: with no_sync, K micro-batches cost one all-reduce and give the gradient
    # of the global batch. (no_sync does not change the gradient's value, only the communication.)
    mp.spawn(dist_workers.accumulate_with_no_sync, args=(2, str(tmp_path / "store")), nprocs=2, join=True)


def test_grad_compression_reaches_the_same_loss(tmp_path, port):
    # Tolerance: 16-bit gradients change each update slightly, not where training ends up: final
    # eval loss within 2% of the full-precision all-reduce's (measured: within 0.1%).
    argv = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "1024", "--eval-size", "101",
            "--batch-size", "32", "--epochs", "2", "--lr", "0.05", "--log-every", "8"]
    runs = {str(tmp_path / comp): [*argv, "--grad-compression", comp] for comp in ("none", "fp16", "bf16")}
    mp.spawn(dist_workers.train_each, args=(2, port, runs), nprocs=2, join=True)
    ref = json.loads((tmp_path / "none" / "summary.json").read_text())
    ref_weights = checkpoint.load(str(tmp_path / "none"), torch.device("cpu"))["model"]
    assert ref["eval_loss"] < 2.0 and ref["world_size"] == 2  # it learned (chance is ln 10 = 2.30)
    for comp in ("fp16", "bf16"):
        summary = json.loads((tmp_path / comp / "summary.json").read_text())
        weights = checkpoint.load(str(tmp_path / comp), torch.device("cpu"))["model"]
        assert summary["grad_compression"] == comp
        assert not torch.equal(weights["1.weight"], ref_weights["1.weight"])  # the hook was in use
        assert abs(summary["eval_loss"] - ref["eval_loss"]) < 0.02 * ref["eval_loss"], (comp, summary, ref)


def test_linreg_two_processes_learn_w_and_b(run_torchrun, tmp_path):
    out = tmp_path / "lin"
    p = run_torchrun(2, ["--dataset", "linreg", "--model", "linear", "--epochs", "10", "--batch-size", "32",
                         "--lr", "0.05", "--output-dir", str(out), "--log-every", "50"])
    finish(p)
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 2
    assert abs(s["weight"] - 2) < 0.05 and abs(s["bias"] - 3) < 0.05, s


def _workers_of(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            if ppid == parent and b"launcher.train" in cmd:
                pids.append(int(entry))
    return pids


def test_sigkill_of_a_worker_resumes_from_checkpoint(run_torchrun, tmp_path):
    args = [*SMALL, "--checkpoint-every", "4", "--step-delay", "0.1"]
    ref = tmp_path / "ref"
    finish(run_torchrun(2, [*args, "--output-dir", str(ref)]))
    expected_steps = json.loads((ref / "summary.json").read_text())["steps"]
    assert expected_steps == 2 * (2048 // 2 // 64)

    out = tmp_path / "killed"
    p = run_torchrun(2, [*args, "--output-dir", str(out)], max_restarts=1)
    wait_for(lambda: any(m.get("event") == "checkpoint" and m["step"] >= 8 for m in metrics(out)), "a checkpoint", timeout=180, poll=0.05)
    victims = _workers_of(p.pid)
    assert len(victims) == 2
    os.kill(victims[1], signal.SIGKILL)  # mid-epoch: epoch 0 has 16 steps
    finish(p)
    ms = metrics(out)
    resumes = [m for m in ms if m["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] >= 8
    killed_at = max(m["step"] for m in ms[: ms.index(resumes[0])] if m["event"] == "step")
    assert resumes[0]["step"] <= killed_at < expected_steps
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == expected_steps


def _rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in env if e.startswith(b"RANK=")).split(b"=", 1)[1])


def test_sigterm_to_one_rank_stops_both_at_the_same_step_then_resumes(run_torchrun, tmp_path):
    # Only rank 1 gets the signal (as when one node's agent or pod is told to stop); ranks agree
    # every 4 steps, so both checkpoint and leave at the same multiple of 4.
    out = tmp_path / "term"
    args = [*SMALL, "--step-delay", "0.05", "--stop-check-every", "4", "--output-dir", str(out)]
    p = run_torchrun(2, args)
    wait_for(lambda: any(m.get("event") == "step" and m["step"] >= 5 for m in metrics(out)), "step 5", timeout=180, poll=0.05)
    workers = _workers_of(p.pid)
    assert sorted(_rank_of(w) for w in workers) == [0, 1]
    os.kill(next(w for w in workers if _rank_of(w) == 1), signal.SIGTERM)
    output = finish(p, timeout=120)
    assert "preempted: checkpoint at step" in output
    first = json.loads((out / "summary.json").read_text())
    assert first["preempted"] is True and first["steps"] < 32 and first["steps"] % 4 == 0, first
    ckpt = checkpoint.load(str(out), torch.device("cpu"))
    assert ckpt["step"] == first["steps"]
    output = finish(run_torchrun(2, args))
    assert f"resumed from {out / 'checkpoint.pt'} at step {first['steps']}" in output
    final = json.loads((out / "summary.json").read_text())
    assert final["steps"] == 32 and final["preempted"] is False


def test_same_seed_gives_identical_weights(tmp_path):
    states = []
    for name in ("a", "b"):
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "launcher.train", "--dataset", "synthetic", "--model", "mlp", "--train-size",
                        "512", "--eval-size", "64", "--epochs", "1", "--seed", "5", "--output-dir", str(out)],
                       check=True, capture_output=True)
        states.append(checkpoint.load(str(out), torch.device("cpu"))["model"])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_a_finished_rank_leaves_without_pythons_teardown_and_loses_no_output(tmp_path):
    """After a good run every rank exits with its code without Python's final teardown, where torch's
    Gloo threads can abort a finished rank (signal 6) and turn a good run into a restart and a
    failure: an atexit marker (from a sitecustomize on PYTHONPATH) must not run, and everything the
    run writes is there and whole."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "if 'LOCAL_RANK' in os.environ:\n"
        "    atexit.register(lambda: open(os.path.join(os.environ['MARKS'], 'teardown-' + os.environ['RANK']), 'w').close())\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(hooks), "MARKS": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "launcher.train", *SMALL, "--output-dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.glob("teardown-*")) == []
    summary = json.loads((out / "summary.json").read_text())
    lines = metrics(out)
    assert summary["world_size"] == 2 and summary["steps"] == len([m for m in lines if m["event"] == "step"])
    assert lines[-1]["event"] == "eval"
    assert "done:" in proc.stdout


def test_a_run_checkpointed_on_three_ranks_resumes_on_two(run_torchrun, tmp_path):
    """Issue 43: a run brought back on fewer nodes goes on from its place in the epoch, counted in
    samples, with the learning-rate schedule of the new world size (as if it had run on it from the
    start), and ends as a run on two ranks would, within the tolerance of the other trainer tests."""
    args = [*SMALL, "--step-delay", "0.05", "--stop-check-every", "2", "--scale-lr", "--warmup-steps", "4"]
    ref = tmp_path / "ref"
    finish(run_torchrun(2, [*args, "--output-dir", str(ref)]))
    out = tmp_path / "moved"
    p = run_torchrun(3, [*args, "--output-dir", str(out)])
    wait_for(lambda: any(m.get("event") == "step" and m["step"] >= 5 for m in metrics(out)), "step 5", timeout=180, poll=0.05)
    os.kill(_workers_of(p.pid)[0], signal.SIGTERM)
    finish(p, timeout=120)
    stopped = json.loads((out / "summary.json").read_text())
    assert stopped["preempted"] is True and stopped["world_size"] == 3, stopped
    saved = stopped["steps"]  # a multiple of 2, in epoch 0 (10 steps of 3 x 64 there)
    assert saved % 2 == 0 and saved < 10, stopped
    output = finish(run_torchrun(2, [*args, "--output-dir", str(out)]))
    resume = next(m for m in metrics(out) if m["event"] == "resume")
    want = saved * 3 * 64 // (2 * 64)  # the samples already trained on, in whole steps of two ranks
    assert (resume["step"], resume["checkpoint_step"], resume["checkpoint_world_size"], resume["world_size"]) == (
        want, saved, 3, 2), resume
    assert f"the checkpoint's step {saved} on world size 3 is step {want} on 2" in output
    final = json.loads((out / "summary.json").read_text())
    expected = json.loads((ref / "summary.json").read_text())
    assert final["steps"] == expected["steps"] == 32 and final["world_size"] == 2
    # The schedule is the two-rank run's own from the step it resumed at: the same rates, bit for bit.
    lrs = {m["step"]: m["lr"] for m in metrics(ref) if m["event"] == "step"}
    after = [m for m in metrics(out) if m["event"] == "step" and m["time"] >= resume["time"]]
    assert after[0]["step"] == want + 1 and all(m["lr"] == lrs[m["step"]] for m in after), after[:3]
    assert abs(final["eval_loss"] - expected["eval_loss"]) < 0.02 * max(expected["eval_loss"], 0.01) + 0.01, (final, expected)


def test_checkpoints_by_time(run_torchrun, tmp_path):
    """--checkpoint-seconds: the ranks agree on a timed checkpoint in their stop check, so each is at
    a step where the check runs, and none comes sooner than the interval after the one before."""
    out = tmp_path / "timed"
    finish(run_torchrun(2, [*SMALL, "--step-delay", "0.05", "--stop-check-every", "2", "--checkpoint-seconds", "0.4",
                            "--output-dir", str(out)]))
    saves = [m for m in metrics(out) if m["event"] == "checkpoint"]
    timed = [m for m in saves if m["reason"] == "time"]
    assert len(timed) >= 2 and all(m["step"] % 2 == 0 for m in timed), saves
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(saves) if b["reason"] == "time"]
    assert min(gaps) >= 0.35, saves  # (an epoch's end saves whatever the clock; times are to the millisecond)


def _two_nodes(args: list[str], outs: tuple[Path, Path], logs: Path) -> list[subprocess.Popen]:
    """The trainer on two torchrun agents of one process each, as two nodes (static rendezvous on this
    machine, gloo), each node with an output directory of its own: nothing shared, as between pods."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for node, out in enumerate(outs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "launcher.train", *args, "--output-dir", str(out)]
        with open(logs / f"node{node}.log", "w") as f:  # a file, not a pipe: neither agent can block on its output
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True,
                                          env={**os.environ, "OMP_NUM_THREADS": "1"}))
    return procs


def _finish_nodes(procs: list[subprocess.Popen], logs: Path, timeout: float = 150) -> str:
    """Both agents' exit (0), within ``timeout`` seconds; node 0's output."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # said below, with what the nodes wrote (the autouse fixture ends what is left)
    outputs = [(logs / f"node{node}.log").read_text() for node in range(len(procs))]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n---\n".join(outputs)
    return outputs[0]


def test_a_checkpoint_on_node_0_only_resumes_every_rank_from_it(tmp_path):
    """Kubernetes pods share no filesystem: only node 0's holds the checkpoint rank 0 wrote. A run
    started again there resumes every rank from rank 0's checkpoint (sent to node 1) at the same step,
    and ends with the weights of a run whose nodes both held it (each rank loading its own, as on a
    shared filesystem), bit for bit, and within the other tests' tolerance of a run never stopped.
    Rank 0's is the run's: where only node 1 holds one, no rank resumes."""
    args = [*SMALL, "--step-delay", "0.05", "--stop-check-every", "4"]
    ref = (tmp_path / "ref0", tmp_path / "ref1")
    _finish_nodes(_two_nodes(args, ref, tmp_path / "logs-ref"), tmp_path / "logs-ref")

    own = (tmp_path / "own0", tmp_path / "own1")
    procs = _two_nodes(args, own, tmp_path / "logs-stop")
    wait_for(lambda: any(m.get("event") == "step" and m["step"] >= 5 for m in metrics(own[0])), "step 5", timeout=180, poll=0.05)
    workers = _workers_of(procs[1].pid)
    assert [_rank_of(w) for w in workers] == [1]
    os.kill(workers[0], signal.SIGTERM)  # node 1 told to stop: both checkpoint (rank 0, on node 0 only) and leave
    _finish_nodes(procs, tmp_path / "logs-stop")
    stopped = json.loads((own[0] / "summary.json").read_text())
    saved = stopped["steps"]
    assert stopped["preempted"] is True and saved % 4 == 0 and saved < 32, stopped
    assert checkpoint.path_in(str(own[0])).exists() and not checkpoint.path_in(str(own[1])).exists()

    both = (tmp_path / "both0", tmp_path / "both1")
    for out in both:
        out.mkdir()
        shutil.copy(checkpoint.path_in(str(own[0])), checkpoint.path_in(str(out)))
    _finish_nodes(_two_nodes(args, both, tmp_path / "logs-both"), tmp_path / "logs-both")
    stale = (tmp_path / "stale0", tmp_path / "stale1")
    stale[1].mkdir()
    shutil.copy(checkpoint.path_in(str(own[0])), checkpoint.path_in(str(stale[1])))
    output = _finish_nodes(_two_nodes(args, stale, tmp_path / "logs-stale"), tmp_path / "logs-stale")
    assert "no rank resumes" in output and "resumed from" not in output, output
    told = [m for m in metrics(stale[0]) if m["event"] in ("resume", "no_resume")]
    assert [(m["event"], m.get("ranks_with_checkpoint")) for m in told] == [("no_resume", [1])], told
    output = _finish_nodes(_two_nodes(args, own, tmp_path / "logs-own"), tmp_path / "logs-own")

    source = own[0] / checkpoint.CHECKPOINT
    assert f"resumed from {source} at step {saved} (epoch 0) (rank 0's checkpoint, sent to ranks without it)" in output
    runs = {name: metrics(outs[0]) for name, outs in (("ref", ref), ("both", both), ("own", own), ("stale", stale))}
    resume = next(m for m in runs["own"] if m["event"] == "resume")
    assert (resume["step"], resume["checkpoint_step"], resume["from"], resume["sent_from_rank0"]) == (
        saved, saved, str(source), True), resume
    resume_both = next(m for m in runs["both"] if m["event"] == "resume")
    assert resume_both["step"] == saved and "sent_from_rank0" not in resume_both, resume_both
    finals = {name: json.loads((outs[0] / "summary.json").read_text()) for name, outs in
              (("ref", ref), ("both", both), ("own", own), ("stale", stale))}
    assert all(f["steps"] == 32 and f["preempted"] is False for f in finals.values()), finals
    # The losses are means over both ranks: node 1 trained on the same batches from the same weights.
    losses = {name: [(m["step"], m["loss"]) for m in ms if m["event"] == "step" and m["step"] > saved]
              for name, ms in runs.items()}
    assert len(losses["own"]) == 32 - saved and losses["own"] == losses["both"], losses
    assert next(m for m in runs["stale"] if m["event"] == "step")["step"] == 1  # from the beginning, as ref
    weights = {name: checkpoint.load(str(outs[0]), torch.device("cpu"))["model"] for name, outs in
               (("both", both), ("own", own))}
    assert all(torch.equal(weights["own"][k], weights["both"][k]) for k in weights["both"])
    assert finals["own"]["eval_loss"] == finals["both"]["eval_loss"]
    expected = finals["ref"]
    for name in ("own", "stale"):
        assert abs(finals[name]["eval_loss"] - expected["eval_loss"]) < 0.02 * max(expected["eval_loss"], 0.01) + 0.01, (
            name, finals[name], expected)
