"""The README and the docs/ pages (issue 36 items 1 and 8): the README fits one screen and links every
page; ``ddpjob --help`` and ``ddpjob docs`` name every page and ship it; every relative link resolves;
and every block of program output they quote is what the program prints now.

A quoted block is a fenced block right after a line ``<!-- output: NAME -->``; ``CHECKS`` says how
each NAME is produced: the real code that prints it (the stage line of a starting job, ``results``,
``status``, ``doctor``'s report), fed a small fixture where the output needs a job. A NAME the test
does not know fails, so no quote goes unchecked."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 150
MARK = re.compile(r"^\s*<!-- output: (?P<name>[^>]+?) -->\s*$")
FENCE = re.compile(r"^\s*```")


def quoted_blocks(path: Path) -> list[tuple[str, list[str], int]]:
    """(NAME, the block's lines without the fence's indentation, its line number) for each marked block."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARK.match(line)
        if not m:
            continue
        assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), f"{path.name}:{i + 1}: no fenced block after the mark"
        indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
        end = next((j for j in range(i + 2, len(lines)) if FENCE.match(lines[j])), None)
        assert end is not None, f"{path.name}:{i + 2}: the fenced block never closes"
        out.append((m["name"], [x[indent:] for x in lines[i + 2:end]], i + 1))
    return out


# --------------------------------------------------------------------------- what the program prints

def _stage_line(runs: list[list[tuple[str, str]]]) -> str:
    """The line ``submit -f`` shows on a terminal while the job starts: the real StageLine and
    live_line, over the real ``Target.stage`` reading these node files; only the job's record is a
    stand-in (``refresh``)."""
    import click

    from launcher.cli import follow
    from launcher.core.states import JobState
    from launcher.targets.base import Target
    from launcher.targets.jobstatus import JobStatus

    class Nodes:  # the target's side that stage() reads: where each node's files are
        stage = Target.stage

        def startup_files(self, handle: object) -> list[list[tuple[str, str]]]:
            return runs

    class Record:
        id, state = "quickstart-ab12c", JobState.RUNNING

    class Service:
        def refresh(self, job_id: str) -> tuple[Record, JobStatus]:
            return Record(), JobStatus(JobState.RUNNING)

        def progress(self, rec: Record) -> None:
            return None

        def bound(self, rec: Record) -> Job:
            return Job()

    class Job:  # the recorded job: its target's stage() with its handle
        def stage(self, status: JobStatus) -> str:
            return Nodes().stage(object(), status)  # type: ignore[arg-type]

    shown: list[str] = []
    original = click.echo

    def echo(message: Any = None, *args: Any, **kwargs: Any) -> None:
        shown.append(str(message))

    line = follow.StageLine(Service(), "quickstart-ab12c")  # type: ignore[arg-type]
    click.echo = echo  # type: ignore[assignment]
    try:
        line.thread.start()
        deadline = time.monotonic() + 10
        while not any("[ddpjob]" in s for s in shown) and time.monotonic() < deadline:
            time.sleep(0.01)
        line.stop()
        line.thread.join(5)
    finally:
        click.echo = original
    texts = [s.replace(follow.CLEAR, "") for s in shown if "[ddpjob]" in s]
    assert texts, shown
    return texts[-1]


def check_stages(block: list[str], tmp_path: Path) -> None:
    """Each quoted line is the stage line of a 2-node job at one of its stages, as the terminal shows
    it (the elapsed time aside: the quote's is free, in the form ``duration`` writes)."""
    from launcher.core.progress import duration

    nodes = [(str(tmp_path / f"node-{n}.log"), str(tmp_path / f"torchrun-{n}")) for n in range(2)]
    printed = []
    for logs, attempts in ((0, 0), (1, 0), (2, 1), (2, 2)):  # none up, one up, one working, both working
        for n, (log, folder) in enumerate(nodes):
            if n < logs:
                Path(log).touch()
            if n < attempts:
                (Path(folder) / "run-0" / "attempt_0").mkdir(parents=True, exist_ok=True)
        printed.append(_stage_line([nodes]))
    elapsed = re.compile(r"^\[ddpjob\] (\d+s|\d+m\d\ds|\d+h\d\dm): ")
    assert all(elapsed.match(p) for p in printed), printed
    expected = {elapsed.sub("[ddpjob] 0s: ", p) for p in printed}
    for line in block:
        assert elapsed.match(line), f"{line!r}: not in the form [ddpjob] {duration(75)}: ..."
        assert elapsed.sub("[ddpjob] 0s: ", line) in expected, f"{line!r} is not printed; the program prints {sorted(expected)}"


def _results_runs(tmp_path: Path, rows: list[dict[str, Any]]) -> list[Any]:
    """RunResults read by the real metrics reader from metrics files written as a run writes them."""
    from launcher.service.results import RunResult, read_metrics

    runs = []
    for row in rows:
        path = tmp_path / f"metrics-{row['index']}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in row["lines"]))
        m = read_metrics(str(path))
        runs.append(RunResult(index=row["index"], values=row["values"], state="SUCCEEDED", duration_s=row["duration_s"],
                              final=m.final, best=m.best, curves=m.curves, output_dir=str(tmp_path)))
    return runs


def _results_output(monkeypatch: pytest.MonkeyPatch, job_id: str, runs: list[Any], args: list[str]) -> list[str]:
    """``ddpjob results JOB ARGS`` as the command prints it; only the registry is a stand-in."""
    from launcher.cli import results
    from launcher.cli.main import cli

    monkeypatch.setattr(results, "_load", lambda _id: (job_id, "local", runs))
    out = CliRunner().invoke(cli, ["results", job_id, *args], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.stdout.splitlines()


def _sweep_row(index: int, lr: float, seed: int, seconds: float, loss: tuple[float, float], eval_loss: tuple[float, float],
               accuracy: tuple[float, float], rate: float, split: tuple[float, float, float]) -> dict[str, Any]:
    """A run of jobs/sweep.yaml whose metrics give the README's figures (the best first, the final last)."""
    # The first window (start-up) is left out of the split: it is far from the others on purpose.
    windows = [{"step": 1, "data_ms": 80.0, "compute_ms": 10.0, "comm_ms": 10.0},
               *({"step": s, "data_ms": split[0], "compute_ms": split[1], "comm_ms": split[2]} for s in (2, 3))]
    lines = [{"step": 1, "loss": loss[1], "samples_per_s": rate / 2}, {"step": 2, "loss": loss[0], "samples_per_s": rate},
             {"step": 1, "eval_loss": eval_loss[1], "eval_accuracy": accuracy[1]},
             {"step": 2, "eval_loss": eval_loss[0], "eval_accuracy": accuracy[0]}, *windows]
    return {"index": index, "values": {"lr": lr, "seed": seed}, "duration_s": seconds, "lines": lines}


def check_results_sweep(block: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's table in docs/trainer.md: its figures are history (a real run's); the table around them,
    the columns, number forms, order and the advice line, are what ``results`` prints now."""
    rows = [_sweep_row(0, 0.1, 1, 6.3, (3.989e-05, 2.319e-05), (0.0117, 0.01105), (0.998, 0.998), 9212, (4, 51, 45)),
            _sweep_row(1, 0.1, 2, 6.4, (9.983e-05, 2.293e-05), (0.005718, 0.005718), (1, 1), 7307, (3.4, 54.4, 42.2)),
            _sweep_row(2, 0.01, 1, 6.1, (0.3476, 0.3302), (0.5451, 0.5451), (1, 1), 6503, (4, 52, 44)),
            _sweep_row(3, 0.01, 2, 6.0, (0.3507, 0.3491), (0.5947, 0.5947), (1, 1), 7892, (4, 49, 47))]
    assert block[0] == "$ ddpjob results sweep-92c2y --sort eval_loss", block[0]
    printed = _results_output(monkeypatch, "sweep-92c2y", _results_runs(tmp_path, rows), ["--sort", "eval_loss"])
    assert block[1:] == printed, "\n".join(["quoted:", *block[1:], "printed:", *printed])


def check_results_own_metric(block: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program of your own writing ``loss`` and a metric of its own, ``f1``: the table shows both."""
    lines = [{"step": 10, "loss": 0.52, "f1": 0.71, "time": 1000.0}, {"step": 20, "loss": 0.31, "f1": 0.83, "time": 1012.0},
             {"step": 30, "loss": 0.34, "f1": 0.81, "time": 1024.0}]
    runs = _results_runs(tmp_path, [{"index": 0, "values": {}, "duration_s": 24.0, "lines": lines}])
    assert block[0] == "$ ddpjob results my-job-x1y2z", block[0]
    printed = _results_output(monkeypatch, "my-job-x1y2z", runs, [])
    assert block[1:] == printed, "\n".join(["quoted:", *block[1:], "printed:", *printed])


def check_status_data_bound(block: list[str], tmp_path: Path) -> None:
    """``ddpjob status``'s progress and advice lines of a run whose batches wait 45% of each step."""
    from launcher.cli.show import status_lines
    from launcher.core.progress import Progress
    from launcher.core.states import JobState
    from launcher.service.registry import JobRecord

    rec = JobRecord(id="mlp-ab12c", name="mlp", target="local", state=JobState.RUNNING, spec={}, handle=None,
                    run_dir=str(tmp_path), port=None, message="", created_at=0.0, updated_at=0.0, ended_at=None)
    progress = Progress(40, 0.0, total_steps=40, loss=0.0288, samples_per_s=258.0, eta_s=0.0, data_ms=45.0,
                        compute_ms=55.0, comm_ms=0.0)
    printed = status_lines(rec, None, progress)
    assert all(line in printed for line in block), "\n".join(["quoted:", *block, "printed:", *printed])


def check_doctor_loopback(block: list[str], tmp_path: Path) -> None:
    """``ddpjob doctor``'s text report of a 2-rank job on one host, from the probe's own report line
    (read, judged and printed by the real code; only the finished job is a stand-in)."""
    import contextlib
    import io

    from launcher.cli.tools import _doctor_report
    from launcher.core.states import JobState
    from launcher.doctor.probe import MARKER

    rank = {"backend": "gloo", "torch": "2.14.1+cpu", "cuda": None, "nccl": None, "gpus": [], "device": "cpu",
            "note": None, "host": "box", "python": "3.11.2", "interfaces": ["eth0", "lo"],
            "addresses": {"eth0": "10.0.0.5", "lo": "127.0.0.1"}, "master_ip": "127.0.0.1", "address": "127.0.0.1",
            "interface": "lo", "env": {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}}
    results = [{"bytes": 2**20 * mib, "iters": 3, "time_us": us, "algbw_gbps": mib * 2**20 / us / 1e3,
                "busbw_gbps": mib * 2**20 / us / 1e3} for mib, us in ((1, 1310.7), (16, 10485.8), (256, 167772.2))]
    report = {"world_size": 2, "ranks": [{**rank, "rank": r, "local_rank": r} for r in range(2)], "results": results}

    class Job:
        state = JobState.SUCCEEDED

    class Jobs:
        def wait(self, job_id: str) -> Job:
            return Job()

        def logs(self, job_id: str, flt: Any, follow: bool = False) -> list[str]:
            return [f"[node0 rank0] {MARKER} {json.dumps(report)}"]

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        _doctor_report(Jobs(), "doctor-ab12c", "text")
    printed = out.getvalue().splitlines()
    assert block == printed, "\n".join(["quoted:", *block, "printed:", *printed])


CHECKS: dict[str, Callable[..., None]] = {
    "stages": check_stages,
    "results-sweep": check_results_sweep,
    "results-own-metric": check_results_own_metric,
    "status-data-bound": check_status_data_bound,
    "doctor-loopback": check_doctor_loopback,
}
QUOTES = [(f"{p.relative_to(REPO)}:{line}", name, block) for p in PAGES for name, block, line in quoted_blocks(p)]


@pytest.mark.parametrize(("where", "name", "block"), QUOTES, ids=[f"{w}:{n}" for w, n, _ in QUOTES])
def test_quoted_output_is_what_the_program_prints(where: str, name: str, block: list[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert name in CHECKS, f"{where}: no check for quoted output {name!r} (add one to CHECKS)"
    check = CHECKS[name]
    if "monkeypatch" in check.__code__.co_varnames[:check.__code__.co_argcount]:
        check(block, tmp_path, monkeypatch)
    else:
        check(block, tmp_path)


def test_the_quotes_that_matter_are_marked() -> None:
    """The README's stage words, doctor's report and the results claims are quoted where they are said."""
    names = {(where.split(":")[0], name) for where, name, _ in QUOTES}
    assert ("README.md", "stages") in names
    assert {("docs/commands.md", "stages"), ("docs/commands.md", "doctor-loopback"), ("docs/trainer.md", "results-sweep"),
            ("docs/trainer.md", "results-own-metric"), ("docs/trainer.md", "status-data-bound")} <= names, names


# --------------------------------------------------------------------------- one screen, every page linked

def test_the_readme_fits_one_screen_and_links_every_page() -> None:
    from launcher.cli.docs import TOPICS

    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"
    linked = set(re.findall(r"\]\(docs/([\w-]+)\.md\)", README.read_text()))
    pages = {p.stem for p in DOCS.glob("*.md")}
    assert pages and pages <= linked, f"not linked from README.md: {sorted(pages - linked)}"
    assert set(TOPICS) == pages, f"ddpjob docs lists {sorted(TOPICS)}; docs/ holds {sorted(pages)}"


def test_help_names_every_page_and_docs_prints_each() -> None:
    from launcher.cli.docs import TOPICS
    from launcher.cli.main import cli

    runner = CliRunner()
    help_text = runner.invoke(cli, ["--help"], catch_exceptions=False).output
    epilogue = help_text.split("Documentation:", 1)[1].split("Exit codes:", 1)[0].split("\n", 1)[1]
    assert [m.group(1) for m in re.finditer(r"^\s+([\w-]+)\s", epilogue, re.M)] == list(TOPICS), epilogue
    for topic in TOPICS:
        out = runner.invoke(cli, ["docs", topic], catch_exceptions=False)
        assert out.exit_code == 0 and out.stdout == (DOCS / f"{topic}.md").read_text(), topic
        path = runner.invoke(cli, ["docs", topic, "--path"], catch_exceptions=False).stdout.strip()
        assert Path(path).resolve() == (DOCS / f"{topic}.md").resolve(), path
    wrong = runner.invoke(cli, ["docs", "nope"])
    assert wrong.exit_code == 2 and "'nope' is not one of" in wrong.output, wrong.output


def test_the_pages_ship_in_the_package() -> None:
    """``launcher/docs`` is the package's copy of docs/ (a link), and pyproject ships its pages."""
    assert (REPO / "launcher" / "docs").resolve() == DOCS.resolve()
    package_data = (REPO / "pyproject.toml").read_text().split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^launcher = \[[^\]]*"docs/\*\.md"[^\]]*\]', package_data, re.M), package_data


def test_every_relative_link_resolves() -> None:
    bad = []
    for page in [*PAGES, REPO / "ARCHITECTURE.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code are not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve()
            if not resolved.exists():
                bad.append(f"{page.name}: {target}")
            elif anchor and resolved.suffix == ".md":
                anchors = {re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-")
                           for h in resolved.read_text().splitlines() if h.startswith("#")}
                if anchor not in anchors:
                    bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, bad


def test_no_page_is_empty_or_orphaned_from_the_readme_tables() -> None:
    """Every page starts with its title and says something."""
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        assert text.startswith("# ") and len(text.splitlines()) > 5, page.name



def test_every_yaml_spec_block_of_the_readme_and_docs_validates(tmp_path: Path) -> None:
    """Issue 45, item 2: the README's "What a job spec looks like" failed `ddpjob validate` (its sweep's
    keys were in no command). Every ```yaml block that has a `command:` (a whole spec) must validate."""
    from launcher.cli.main import cli as main

    checked = []
    for page in PAGES:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)):
            if not re.search(r"^command:", block, re.M):
                continue  # a fragment (a defaults file, one section)
            spec = tmp_path / f"{page.stem}-{i}.yaml"
            spec.write_text(block)
            result = CliRunner().invoke(main, ["validate", str(spec)])
            assert result.exit_code == 0, f"{page.name}, yaml block {i}:\n{result.output}"
            checked.append(page.name)
    assert "README.md" in checked
