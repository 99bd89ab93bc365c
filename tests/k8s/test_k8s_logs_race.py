"""``logs`` (without -f) when a container restarts between the pod's status and its log being read.

The pod list, the log and the previous run's log are separate API calls. The real path runs in
test_k8s_target.py (``test_restart_keeps_previous_logs_and_cancel_is_idempotent``, where the fake API
server restarts the container on its own clock: this race failed it about once in nine runs); here
a scripted API puts the restart exactly between the calls, every time."""

from __future__ import annotations

from typing import Any

from launcher.targets.base import LogFilter
from launcher.targets.k8s.cluster.logs import PodLogs

JOB = "demo-abcde"
POD = f"{JOB}-master-0"
FIRST = b"attempt first\n"
SECOND = b"attempt second\nnow waiting\n"


def pod(restarts: int) -> dict[str, Any]:
    return {"metadata": {"name": POD, "uid": "0123456789abcdef", "creationTimestamp": "2026-11-26T12:00:00Z"},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "pytorch", "restartCount": restarts, "state": {"running": {}}}]}}


class ScriptedKube:
    """The pod's status as listed, then as read again after the logs; the logs of both runs."""

    def __init__(self, listed: int, after: int, current: bytes) -> None:
        self.listed, self.after, self.current = listed, after, current
        self.previous_reads = 0
        self.previous = FIRST

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        return [pod(self.listed)]

    def get_pod(self, name: str) -> dict[str, Any]:
        return pod(self.after)

    def pod_log(self, name: str, *, previous: bool = False, tail: int | None = None) -> bytes | None:
        if previous:
            self.previous_reads += 1
            return self.previous
        return self.current


def logs(tmp_path, kube: ScriptedKube) -> list[str]:
    reader = PodLogs(kube, str(tmp_path), [{"name": JOB, "index": 0}], 1, LogFilter())
    return list(reader.snapshot())


def test_a_restart_between_status_and_log_overwrites_no_run(tmp_path):
    # An earlier `logs` saved the first run while it ran.
    assert logs(tmp_path, ScriptedKube(0, 0, FIRST)) == ["[master-0] attempt first"]
    # Listed before the restart, read after it: the log is the second run's, not the first's.
    shown = logs(tmp_path, ScriptedKube(0, 1, SECOND))
    assert shown == ["[master-0] attempt first"], shown
    # The next read sees the restart: both runs, in order.
    shown = logs(tmp_path, ScriptedKube(1, 1, SECOND))
    assert shown == ["[master-0] attempt first", "[master-0] attempt second",
                     "[master-0] now waiting"], shown


def test_a_run_saved_while_it_ran_is_saved_whole_once_it_has_ended(tmp_path):
    # Saved while the first run had printed one line; it then crashed with a traceback.
    assert logs(tmp_path, ScriptedKube(0, 0, FIRST)) == ["[master-0] attempt first"]
    kube = ScriptedKube(1, 1, SECOND)
    kube.previous = FIRST + b"Traceback: boom\n"
    shown = logs(tmp_path, kube)
    assert shown == ["[master-0] attempt first", "[master-0] Traceback: boom", "[master-0] attempt second",
                     "[master-0] now waiting"], shown
    kube = ScriptedKube(1, 1, SECOND)
    logs(tmp_path, kube)
    assert kube.previous_reads == 0  # saved whole once: not fetched again


def test_a_status_that_lags_the_restart_is_mended_one_read_later(tmp_path):
    assert logs(tmp_path, ScriptedKube(0, 0, FIRST)) == ["[master-0] attempt first"]
    # The API server still says 0 restarts on both reads while the log is already the second run's
    # (the kubelet reports its status a moment later): that run lands in the first run's file...
    logs(tmp_path, ScriptedKube(0, 0, SECOND[:15]))
    # ...and once the status says 1, the first run's whole log is fetched from the previous
    # container's, over it.
    kube = ScriptedKube(1, 1, SECOND)
    shown = logs(tmp_path, kube)
    assert kube.previous_reads == 1
    assert shown == ["[master-0] attempt first", "[master-0] attempt second", "[master-0] now waiting"], shown
