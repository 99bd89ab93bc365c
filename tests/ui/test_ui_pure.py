"""The dashboard's pure parts: who may talk to it, the curves it draws, the HTML it escapes, and a
CLI that loads no web framework until ``ddpjob ui`` runs (and says which extra is missing)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from launcher.core.progress import Progress
from launcher.core.states import JobState
from launcher.service.compare import ComparedRun
from launcher.service.records import JobShape
from launcher.service.registry import JobRecord
from launcher.service.results import RunResult
from launcher.ui import guard, pages, svg
from launcher.ui.serve import risk
from launcher.ui.view import JobFilter, JobRow, JobView

PORT = 8765


@pytest.mark.parametrize(("listen", "header", "ok"), [
    ("127.0.0.1", "127.0.0.1:8765", True),
    ("127.0.0.1", "localhost:8765", True),
    ("127.0.0.1", "LOCALHOST:8765", True),
    ("127.0.0.1", "evil.example:8765", False),  # DNS rebinding: a name made to resolve to 127.0.0.1
    ("127.0.0.1", "127.0.0.1:8766", False),
    ("127.0.0.1", "127.0.0.1", False),
    ("127.0.0.1", "", False),
    ("127.0.0.1", "127.0.0.1:8765.evil.example", False),
    ("::1", "[::1]:8765", True),
    ("::1", "::1:8765", False),
    ("192.0.2.7", "192.0.2.7:8765", True),
    ("192.0.2.7", "localhost:8765", False),
    ("0.0.0.0", "192.0.2.7:8765", True),  # any address literal: no name, nothing to rebind
    ("0.0.0.0", "[2001:db8::1]:8765", True),
    ("0.0.0.0", "evil.example:8765", False),
    ("0.0.0.0", "192.0.2.7:9999", False),
])
def test_host_header_check(listen, header, ok):
    assert guard.allowed(header, guard.allowed_hosts(listen, PORT), PORT) is ok


def test_tokens_are_long_and_fresh():
    a, b = guard.new_token(), guard.new_token()
    assert a != b and len(a) >= 32 and re.fullmatch(r"[A-Za-z0-9_-]+", a)


def test_listening_beyond_loopback_says_the_risk():
    assert risk("127.0.0.1", PORT) is None and risk("::1", PORT) is None and risk("localhost", PORT) is None
    said = risk("0.0.0.0", PORT)
    assert said and "anyone who can reach 0.0.0.0:8765" in said and "not encrypted" in said and "ssh -L" in said
    assert "[2001:db8::1]:8765" in (risk("2001:db8::1", PORT) or "")


def test_chart_draws_one_line_per_run_and_escapes_labels():
    series = [("run 0: lr=0.1", svg.colour(0), [(1, 2.0), (2, 1.0), (3, 0.5)]),
              ("run 1: <script>alert(1)</script>", svg.colour(1), [(1, 3.0), (3, float("nan")), (4, 0.7)]),
              ("run 2", svg.colour(2), [(2, 1.5)])]
    out = svg.chart("loss", series)
    assert out.startswith("<svg") and out.endswith("</svg>")
    assert out.count('<polyline class="run"') == 2 and out.count('<circle class="run"') == 1
    assert f'stroke="{svg.colour(0)}"' in out and f'stroke="{svg.colour(1)}"' in out and svg.colour(0) != svg.colour(1)
    assert "<script>" not in out and "&lt;script&gt;" in out
    second = re.findall(r'<polyline class="run" points="([^"]+)"', out)[1]
    assert len(second.split()) == 2  # the NaN point is left out
    for point in " ".join(re.findall(r'points="([^"]+)"', out)).split():  # inside the frame
        x, y = map(float, point.split(","))
        assert svg.LEFT <= x <= svg.WIDTH - svg.RIGHT and svg.TOP <= y <= svg.HEIGHT - svg.BOTTOM
    assert "no points yet" in svg.chart("loss", [("run 0", svg.colour(0), [])])


def test_chart_of_a_long_run_is_thinned_and_keeps_the_last_point():
    pts = [(i, 1.0 / (i + 1)) for i in range(10_000)]
    thin = svg.thin(pts)
    assert len(thin) == svg.MAX_POINTS and thin[0] == pts[0] and thin[-1] == pts[-1]


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 1.0), (0.013, 0.0171), (-3.0, 250.0), (5.0, 5.0), (1e-7, 3e-7)])
def test_ticks_are_round_and_inside(lo, hi):
    ticks = svg.nice_ticks(lo, hi)
    assert ticks and all(lo - 1e-12 <= t <= hi + 1e-12 for t in ticks)
    assert len(ticks) <= 12


def record(**kw) -> JobRecord:
    base = {"id": "demo-ab2cd", "name": "demo", "target": "local", "state": JobState.RUNNING, "spec": {"nodes": 2},
            "handle": None, "run_dir": "/tmp/x", "port": None, "message": "", "created_at": time.time() - 125,
            "updated_at": time.time(), "ended_at": None, "shape": JobShape(runs=2, nodes=2, procs_per_node=2)}
    base.update(kw)
    return JobRecord(**base)  # type: ignore[arg-type]


def test_jobs_table_shows_state_progress_age_target_and_escapes():
    rows = [JobRow(record(message="<img src=x onerror=alert(1)>"), Progress(30, 0.0, total_steps=120, loss=0.5, task=1)),
            JobRow(record(id="old-zzzzz", state=JobState.FAILED, created_at=time.time() - 3 * 86400), None)]
    html = pages.jobs_table(rows, "TOKEN")
    assert "<img" not in html and "&lt;img" in html
    assert 'href="/jobs/demo-ab2cd?token=TOKEN"' in html
    assert '<progress max="120" value="30">' in html and "step 30/120, loss 0.5000 (run 1)" in html
    assert ">2m<" in html and ">3d<" in html and "state-FAILED" in html and ">local<" in html
    assert "No jobs yet" in pages.jobs_table([], "TOKEN")


def test_job_page_draws_runs_and_offers_cancel_only_while_it_runs():
    runs = [RunResult(i, {"lr": lr}, "RUNNING", 12.0, {"loss": 0.1}, {"loss": 0.05},
                      {"loss": [(1, 1.0), (2, 0.5)], "eval_samples": [(2, 64.0)]}, None)
            for i, lr in enumerate(("0.1", "0.01"))]
    view = JobView(record(), None, None, runs, 1, [(0, ["[node0 rank0] <b>hi</b>"]), (1, [])])
    live = pages.job_live(view, "TOKEN")
    assert live.count('<polyline class="run"') == 2 and "run 1: lr=0.01" in live
    assert "eval_samples" not in live  # a constant is not charted
    assert 'method="post" action="/jobs/demo-ab2cd/cancel?token=TOKEN"' in live and "data-final" not in live
    assert "&lt;b&gt;hi&lt;/b&gt;" in live and "(nothing yet)" in live
    assert "not shown here" not in live
    many = pages.job_live(JobView(record(), None, None, runs, 0, [(n, ["x"]) for n in range(8)], nodes=64), "T")
    assert many.count('<pre class="log"') == 8 and "Nodes 8..63 are not shown here" in many
    ended = pages.job_live(JobView(record(state=JobState.FAILED, message="rank 1 exited 1"), None, None, [], 0, []), "T")
    assert "data-final" in ended and "cancel" not in ended and "Root cause" in ended
    # Its duration as status and list give it: the target's start to its end (here 7 s), however late asked.
    dated = pages.job_live(JobView(record(state=JobState.SUCCEEDED, created_at=time.time() - 3600, started_at=time.time() - 600,
                                          ended_at=time.time() - 593), None, None, [], 0, []), "T")
    assert "<dt>duration</dt><dd>7.0s</dd>" in dated and "<dt>started</dt>" in dated, dated


def test_cli_start_up_loads_no_web_framework():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom launcher.cli.main import cli\n"
            "r = CliRunner().invoke(cli, ['ui', '--help'])\nassert r.exit_code == 0, r.output\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'anyio', 'launcher') "
            "and not m.startswith(('launcher.cli', 'launcher.core', 'launcher.targets')) and m != 'launcher'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("missing", ["uvicorn", "starlette"])
def test_ui_without_the_extra_names_it(monkeypatch, missing):
    """Issue 45, item 1: without starlette, `ddpjob ui` was an internal error (exit 70): the dashboard's
    modules import it at their top, before their own check could say what to install."""
    from launcher.cli.main import cli

    for module in [m for m in sys.modules if m == missing or m.startswith(missing + ".")] or [missing]:
        monkeypatch.setitem(sys.modules, module, None)  # what an install without the ui extra sees
    for module in [m for m in sys.modules if m.startswith("launcher.ui.")]:  # imported anew, as in a fresh process
        monkeypatch.delitem(sys.modules, module)
    result = CliRunner().invoke(cli, ["ui", "--port", "0"])
    assert result.exit_code == 3, result.output
    assert "pip install 'ddpjob[ui]'" in result.output and "Traceback" not in result.output


def test_spec_is_shown_masked_without_unset_fields_or_other_targets(tmp_path):
    from launcher.ui.view import plan_text, spec_text

    spec = {"name": "demo", "command": ["python", "t.py"], "env": {"API_TOKEN": "hunter2", "SEED": "1"},
            "image": None, "sweep": {}, "local": {"container": "none"}, "slurm": {"partition": None}, "k8s": {"api": "x"}}
    text = spec_text(record(spec=spec, run_dir=str(tmp_path)))
    assert "hunter2" not in text and "API_TOKEN: '***'" in text and "SEED: '1'" in text
    assert "local:" in text and "slurm" not in text and "k8s" not in text and "image" not in text and "sweep" not in text
    assert plan_text(record(run_dir=str(tmp_path))) is None
    (tmp_path / "plan.txt").write_text("x" * (70 * 1024))
    cut = plan_text(record(run_dir=str(tmp_path))) or ""
    assert len(cut) < 66 * 1024 and cut.endswith("(cut: the whole plan is in plan.txt)\n")


@pytest.mark.parametrize(("seconds", "shown"), [(None, ""), (0.42, "0.4s"), (12.7, "12s"), (185, "3m05s"), (7800, "2h10m")])
def test_durations(seconds, shown):
    assert pages.duration(seconds) == shown


def test_a_busy_port_or_a_foreign_address_is_a_clear_error():
    import socket

    from launcher.cli.main import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["ui", "--port", str(port)])
    assert result.exit_code == 3, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "--port" in result.output
    result = CliRunner().invoke(cli, ["ui", "--port", "0", "--host", "192.0.2.1"])  # TEST-NET-1: not this machine's
    assert result.exit_code == 2 and "--host 192.0.2.1: not an address of this machine" in result.output, result.output


def _read_all_then_tail(path, tail, final):
    """What read_lines gave before it read only the end: the whole file, then its last lines."""
    data = path.read_bytes()
    end = len(data) if final else data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8", "replace").splitlines()
    return (lines[-tail:] if tail else []), end


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("tail", [0, 1, 3, 40, 5000])
@pytest.mark.parametrize("shape", ["short", "long", "long lines", "no newline", "progress bars", "empty"])
def test_log_tail_reads_the_end_only_and_agrees_with_the_whole_file(tmp_path, monkeypatch, shape, tail, final):
    """The job page polls each node's last lines every 2 s: ``read_lines`` with a tail reads the end of
    the file (growing its window until it holds enough lines), with the lines and offset of a whole read."""
    from launcher.targets.shared import logtail

    monkeypatch.setattr(logtail, "_TAIL_CHUNK", 1024)  # small windows: several growths on these files
    body = {"short": "a\nb\nc\n", "long": "".join(f"line {i} ü\n" for i in range(20_000)),
            "long lines": "".join(("x" * 3000) + f" {i}\n" for i in range(50)),
            "no newline": "z" * 5000, "progress bars": "".join(f"{i}%\r" for i in range(3000)) + "done\n",
            "empty": ""}[shape]
    path = tmp_path / "node-0.log"
    path.write_bytes(body.encode() + b"partial, being written")
    assert logtail.read_lines(str(path), tail, final) == _read_all_then_tail(path, tail, final)
    read: list[int] = []

    class Counting:  # the file object read_lines gets, counting the bytes it reads
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, *a):
            data = self.f.read(*a)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(logtail, "open", lambda *a, **k: Counting(open(*a, **k)), raising=False)  # noqa: SIM115
    assert logtail.read_lines(str(path), 3, final) == _read_all_then_tail(path, 3, final)
    if shape == "long":
        assert sum(read) <= 1024 < path.stat().st_size // 100


def test_pages_hold_nothing_their_policy_blocks():
    """The pages' Content-Security-Policy allows only the dashboard's own script and style files:
    an inline script, style or event handler would silently not work."""
    runs = [RunResult(0, {}, "RUNNING", 1.0, {"loss": 1.0}, {"loss": 1.0}, {"loss": [(1, 2.0), (2, 1.0)]}, None)]
    view = JobView(record(), None, Progress(2, 0.0, total_steps=9), runs, 0, [(0, ["x"])])
    live = pages.job_live(view, "T")
    from launcher.service.compare import _split, job_facets
    from launcher.ui.comparepage import compare_page

    rec = record()
    cmp = _split([ComparedRun(rec.id, "local", runs[0], rec.id, job_facets(rec, with_target_section=True))], [])
    for html in (pages.jobs_page("T", "/h", pages.jobs_table([JobRow(record(), None)], "T")),
                 pages.job_page(view, "T", "/h", live, "name: demo\n", "plan"), live, compare_page(cmp, "T", "/h"),
                 compare_page(None, "T", "/h"), "".join(pages.whole_log(rec.id, 0, None, ["x"], "T", "/h"))):
        assert not re.search(r"<script(?![^>]*\ssrc=)", html) and "<style" not in html
        assert not re.search(r"\sstyle=|\son[a-z]+=|javascript:", html)


def test_the_jobs_filter_keeps_by_state_target_and_any_part_of_id_or_name():
    rec = record(id="cifar-ab2cd", name="cifar", state=JobState.FAILED, target="slurm")
    assert JobFilter().keeps(rec) and not JobFilter().active
    assert JobFilter(state="FAILED", target="slurm", name="IFA").keeps(rec) and JobFilter(name="ab2").keeps(rec)
    assert not JobFilter(state="RUNNING").keeps(rec) and not JobFilter(target="local").keeps(rec)
    assert not JobFilter(name="mnist").keeps(rec)
    assert JobFilter(name="x").params() == {"state": None, "target": None, "name": "x"}
    html = pages.jobs_page("T", "/h", pages.jobs_table([], "T", filtered=True), JobFilter(state="FAILED", name='"><b>'))
    assert "No job matches the filter." in html and "<option selected>FAILED</option>" in html
    assert 'value="&quot;&gt;&lt;b&gt;"' in html and "state=FAILED" in html  # the live part keeps the filter
    assert 'action="/compare"' in html and 'name="token" value="T"' in html


def test_the_jobs_table_ticks_jobs_for_compare_and_fills_empty_cells():
    html = pages.jobs_table([JobRow(record(spec={}, shape=None), None)], "T")
    assert '<input type="checkbox" name="id" value="demo-ab2cd"' in html and '<td class="id">' in html
    assert '<td class="progress">\u2014</td><td class="num">\u2014</td>' in html


def test_a_nodes_whole_log_is_escaped_and_sent_line_by_line():
    parts = list(pages.whole_log("demo-ab2cd", 1, 2, iter(["<b>one</b>", "two"]), "T", "/h"))
    assert parts[1:3] == ["&lt;b&gt;one&lt;/b&gt;\n", "two\n"] and parts[-1].endswith("</html>")
    assert "node 1 of run 2, whole log" in parts[0] and "ddpjob logs demo-ab2cd --node 1 --task 2" in parts[0]


def test_the_compare_page_without_jobs_says_how_to_tick_them():
    from launcher.ui.comparepage import compare_page

    assert "Tick two or more jobs on the jobs page" in compare_page(None, "T", "/h")


def test_job_page_shows_every_rank_as_top_does_with_the_flagged_one_marked():
    """The dashboard's job page holds top's table (launcher.targets.shared.health.rows): every rank with
    CPU, memory and output age, "no GPU" on a machine without one and why under the table (as top says
    it), the straggler's row marked."""
    from launcher.targets.shared.health import parse

    now = time.time()
    rank = {"local_rank": 0, "state": "R", "cpu": 97.0, "rss": 300 << 20, "output": now - 2,
            "steps": {"step": 9, "t": now, "step_ms": 100, "data_ms": 1, "compute_ms": 20, "comm_ms": 70}}
    nodes = [{"node": n, "host": f"<h{n}>", "heard": now, "vitals": {"node": n, "t": now, "no_gpu": "no GPU (nvidia-smi not found)",
              "ranks": [{**rank, "rank": n, "pid": 10 + n}]}} for n in (0, 1)]
    state = {"updated": now, "timeout": 300, "action": "report", "nodes": nodes, "verdict": None,
             "stragglers": [{"rank": 1, "node": 1, "message": "rank 1 on node 1 is the slowest"}]}
    view = JobView(record(), None, None, [], 0, [], health=parse(state, now=now))
    live = pages.job_live(view, "TOKEN")
    assert "<h2>Ranks" in live and "straggler: rank 1 on node 1 is the slowest" in live
    assert live.count("<tr class=\"straggler\">") == 1 and "&lt;h1&gt;" in live and "<h1>" not in live.split("Ranks")[1]
    assert live.count("300.0 MiB") == 2 and live.count("<td>no GPU</td>") == 2 and "2s ago" in live
    assert live.count("no GPU") == 3 and live.count('<p class="muted">no GPU (nvidia-smi not found)</p>') == 1  # why, once
    assert "<h2>Ranks" not in pages.job_live(JobView(record(), None, None, [], 0, []), "TOKEN")


def test_the_job_page_tells_each_lost_node_and_the_way_back():
    """Issue 43: under the nodes, each loss of the run and what the run did about it, escaped."""
    from launcher.targets.jobstatus import JobStatus, Loss, NodeStatus, TaskStatus

    loss = Loss(1, time.time(), "its torchrun agent (pid 7) was killed by <SIGKILL>", back_at=time.time() + 1.5, nodes=2,
                replaced=True, resumed_step=40, checkpoint_step=40, reached_step=44)
    task = TaskStatus(0, JobState.RUNNING, nodes=[NodeStatus(0), NodeStatus(1)], losses=[loss], goodput=0.9)
    live = pages.job_live(JobView(record(), JobStatus(JobState.RUNNING, "", [task]), None, [], 0, []), "T")
    assert "Lost nodes" in live and "recovered: 1 lost node(s) brought back, goodput 90%" in live
    assert "was killed by &lt;SIGKILL&gt;); back 1.5s later on 2 node(s), node 1 replaced; resumed at step 40: 4 step(s)" in live
    plain = pages.job_live(JobView(record(), JobStatus(JobState.RUNNING, "", [TaskStatus(0, JobState.RUNNING,
                                                                                         nodes=[NodeStatus(0)])]),
                                   None, [], 0, []), "T")
    assert "Lost nodes" not in plain
