"""Issue 25 item 2: ``logs`` leads with the user's lines; a torchrun agent's own tracebacks, log
records and "Root Cause" report are hidden (``--verbose`` shows them), anything else passes."""

from __future__ import annotations

from pathlib import Path

from launcher.targets.shared.logtail import AgentNoise, LogSource, follow_files

AGENT = """\
[default1]:Traceback (most recent call last):
[default1]:  File "/work/train.py", line 7, in <module>
[default1]:ValueError: bad batch
E1125 17:29:47.920000 28853 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1
ddpjob node 0: NCCL_SOCKET_IFNAME=eth9 matches no interface
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    main()
           ^^^^
torch.distributed.elastic.rendezvous.api.RendezvousClosedError: closed

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "torch/distributed/run.py", line 1142, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
  rank      : 1 (local_rank: 1)
============================================================
srun: error: node-1: task 0: Exited with exit code 1
"""


def test_agent_noise_keeps_ranks_ddpjob_and_srun_lines_and_each_tracebacks_last_line():
    noise = AgentNoise()
    agent_lines = [ln for ln in AGENT.splitlines() if not ln.startswith("[default")]
    shown = [out for ln in agent_lines if (out := noise.show(ln)) is not None]
    assert shown == ["ddpjob node 0: NCCL_SOCKET_IFNAME=eth9 matches no interface",
                     "torchrun stopped: RendezvousClosedError: closed",  # a chained exception: each one's last line
                     "torchrun stopped: ChildFailedError",
                     "srun: error: node-1: task 0: Exited with exit code 1"]
    assert noise.hidden == len(agent_lines) - 4


def test_logs_hide_the_noise_unless_verbose_and_tail_counts_what_is_shown(tmp_path: Path):
    log = tmp_path / "node-0.log"
    log.write_text(AGENT)
    src = [LogSource(str(log), "node0", node=0, procs_per_node=2)]
    shown = list(follow_files(src, tail=None, rank=None, follow=False, finished=lambda: True))
    assert shown[:3] == ['[node0 rank1] Traceback (most recent call last):',
                         '[node0 rank1]   File "/work/train.py", line 7, in <module>', "[node0 rank1] ValueError: bad batch"]
    assert "Root Cause" not in "\n".join(shown) and len(shown) == 7
    verbose = list(follow_files(src, tail=None, rank=None, follow=False, finished=lambda: True, verbose=True))
    assert len(verbose) == len(AGENT.splitlines()) and any("Root Cause" in line for line in verbose)
    last = list(follow_files(src, tail=2, rank=None, follow=False, finished=lambda: True))
    assert last == ["[node0] torchrun stopped: ChildFailedError", "[node0] srun: error: node-1: task 0: Exited with exit code 1"]
    assert list(follow_files(src, tail=1, rank=1, follow=False, finished=lambda: True)) == ["[node0 rank1] ValueError: bad batch"]
