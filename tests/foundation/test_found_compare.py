"""Runs of several jobs side by side (issue 36, "compare runs across jobs"): what each job recorded
turned into facets, and which of them differ (pure tier). Real jobs on two targets:
tests/slurm/test_slurm_results.py; the dashboard's compare view: tests/ui/."""

from __future__ import annotations

import pytest

from launcher.core.states import JobState
from launcher.service.compare import ComparedRun, Comparison, _split, command_facets, job_facets, no_metrics_note, short
from launcher.service.records import JobShape
from launcher.service.registry import JobRecord
from launcher.service.results import RunResult

DIGEST = "sha256:" + "ab" * 32


def record(job_id: str, target: str, spec: dict, shape: dict | None = None) -> JobRecord:
    full = {"name": "mine", "command": ["python", "train.py"], "nodes": 1, "procs_per_node": 1, "env": {},
            "image": None, "sweep": {}, "local": {"network": "host"}, "slurm": {"time": "10"}, **spec}
    return JobRecord(job_id, "mine", target, JobState.SUCCEEDED, full, {"run_dir": "/r"}, "/r", None, "", 0.0, 0.0,
                     None, JobShape.from_json(shape or {"runs": 1, "nodes": full["nodes"], "procs_per_node": 1}))


def runs_of(rec: JobRecord, same_target: bool, *values: dict) -> list[ComparedRun]:
    base = job_facets(rec, with_target_section=same_target)
    results = [RunResult(i, v, "SUCCEEDED", 1.0, {}, {}, {}, None) for i, v in enumerate(values or [{}])]
    return [ComparedRun(rec.id, rec.target, r, rec.id if not r.values else f"{rec.id}/{r.index}", {**base, **{
        k: str(v) for k, v in r.values.items()}}) for r in results]


@pytest.mark.parametrize(("argv", "facets"), [
    (["python", "train.py"], {"command": "python train.py"}),
    (["python", "-m", "launcher.train", "--lr", "0.1", "--amp", "--epochs=3"],
     {"command": "python", "command -m": "launcher.train", "command --lr": "0.1", "command --amp": "yes",
      "command --epochs": "3"}),
    (["run.sh", "--shift", "-1", "--tag", "a", "--tag", "b", "extra"],
     {"command": "run.sh", "command --shift": "-1", "command --tag": "a b extra"}),  # a negative number is a value
    (["python", "x.py", "it's here"], {"command": "python x.py 'it'\"'\"'s here'"}),
])
def test_a_command_splits_into_its_options(argv, facets):
    assert command_facets(argv) == facets


def test_what_differs_between_two_local_jobs_and_a_slurm_sweep():
    a = record("mine-aaaaa", "local", {"command": ["python", "train.py", "--lr", "0.5"]})
    b = record("mine-bbbbb", "local", {"command": ["python", "train.py", "--lr", "0.5"], "env": {"MODE": "fast",
                                                                                                 "KEY": "***"}})
    c = record("mine-ccccc", "slurm", {"command": ["python", "train.py", "--lr", "{lr}"], "image": f"repo@{DIGEST}",
                                       "nodes": 2, "env": {"KEY": "***"}})
    runs = runs_of(a, False) + runs_of(b, False) + runs_of(c, False, {"lr": 0.5}, {"lr": 2.0})
    cmp = _split(runs, [])
    # Shared once; the differing ones as columns, the job's shape first; other targets' sections nowhere.
    assert cmp.shared == {"procs": "1", "command": "python train.py"}
    assert cmp.differing == ["target", "nodes", "image", "command --lr", "env.MODE", "env.KEY", "lr"]
    assert [r.label for r in runs] == ["mine-aaaaa", "mine-bbbbb", "mine-ccccc/0", "mine-ccccc/1"]
    assert cmp.differs(runs[0]) == {"target": "local", "nodes": "1", "image": "-", "command --lr": "0.5",
                                    "env.MODE": "-", "env.KEY": "-", "lr": "-"}
    assert cmp.label(runs[3]) == ("mine-ccccc/1: target=slurm nodes=2 image=repo@sha256:abababababab command --lr={lr} "
                                  "env.MODE=- env.KEY=*** lr=2.0")  # the digest cut, the secret still masked
    assert not any("slurm.time" in k or "local.network" in k for k in [*cmp.shared, *cmp.differing])


def test_the_targets_own_section_counts_when_every_job_has_that_target():
    a = record("mine-aaaaa", "slurm", {"slurm": {"time": "10", "partition": "debug"}})
    b = record("mine-bbbbb", "slurm", {"slurm": {"time": "60", "partition": "debug"}})
    cmp = _split(runs_of(a, True) + runs_of(b, True), [])
    assert cmp.differing == ["slurm.time"] and cmp.shared["slurm.partition"] == "debug"
    assert cmp.label(cmp.runs[1]) == "mine-bbbbb: slurm.time=60"


def test_identical_jobs_share_everything_and_a_job_without_metrics_says_why():
    a, b = record("mine-aaaaa", "local", {}), record("mine-bbbbb", "k8s", {})
    cmp = _split(runs_of(a, False) + runs_of(a, False), [])
    assert cmp.differing == [] and cmp.label(cmp.runs[0]) == "mine-aaaaa"
    assert Comparison([], [], {}, []).differing == [] and _split([], []).shared == {}
    bare = [RunResult(0, {}, "RUNNING", None, {}, {}, {}, "/o")]
    assert no_metrics_note(a, bare) == ("no metrics yet: its program has not appended a line with a step to "
                                        "$DDPJOB_METRICS_FILE")
    assert (no_metrics_note(b, bare) or "").startswith("no metrics: Kubernetes runs write their metrics inside their pods")
    assert (no_metrics_note(a, []) or "").startswith("no runs: the job's submission did not complete")
    assert no_metrics_note(a, [RunResult(0, {}, "RUNNING", None, {}, {}, {"loss": [(1, 1.0)]}, "/o")]) is None


def test_long_values_are_cut_for_tables_and_legends():
    assert short(f"registry:5000/img@{DIGEST}") == "registry:5000/img@sha256:abababababab"
    assert short("x" * 100) == "x" * 45 + "..." and short("x" * 48) == "x" * 48


def test_unknown_ids_are_named_at_once_and_nothing_is_half_printed(tmp_path, cli):
    for command in ("results", "plot"):
        proc = cli(command, "nope-1", "nope-2", env={"DDPJOB_HOME": str(tmp_path)})
        assert proc.returncode == 4 and proc.stdout == "", proc.stdout + proc.stderr
        assert "no job with id 'nope-1'; no job with id 'nope-2'; run `ddpjob list`" in proc.stderr
        assert "Traceback" not in proc.stderr
