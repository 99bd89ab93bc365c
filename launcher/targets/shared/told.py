"""What the first pod's ``watch.json`` says of a run's losses (``Told``), for a ``status`` that cannot read
the run's files: the Kubernetes pod runner's (``k8s/job/podrun.py``). Standard library only: the pod
runner's bundle carries this module (``ddpjob_told``).
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a wing's module imports the standard library only
    from launcher.core.jsondata import JSON, JSONObject
    from launcher.targets.shared.restarts import Recovery


class Told:
    """What the first pod's ``watch.json`` says of a run's losses, for a ``status`` that cannot read the
    run's files (``k8s/job/podrun.py``): the recovery's record and, once it lost a node, the lines of the
    program's metrics file that tell where it resumed (``shared/recovery.py`` reads the same): its first
    step, each resume with the step before and after it, and its newest checkpoints. The file is read as
    it grows, at most ``CHUNK`` bytes a call."""

    CHUNK = 4 * 2**20
    CHECKPOINTS = 100

    def __init__(self, rec: Recovery) -> None:
        self.rec = rec
        self.offset, self.rest = 0, b""
        # The metrics file's events, each an object with an integer ``step`` and a number ``time``.
        self.first: JSONObject | None = None
        self.marks: list[JSONObject] = []  # resumes, the step before each and the first step after
        self.checkpoints: list[JSONObject] = []
        self.last_step: JSONObject | None = None
        self.resumed = False
        self._lock = threading.RLock()  # the watch's thread (``state``) and the runner's as it ends (``final``)

    def state(self) -> dict[str, object]:
        """The part of ``watch.json`` the watch adds (``heartbeat.Watch.extra``)."""
        with self._lock:
            out: dict[str, object] = {"recovery": self.rec.record()}
            if self.rec.losses and self.rec.metrics:
                self._read(self.rec.metrics)
                out["events"] = sorted(([self.first] if self.first else []) + self.marks + self.checkpoints, key=_time)
            return out

    def final(self) -> dict[str, object]:
        """What the first pod's runner prints as it ends (``podrun.TOLD_LINE``), for a ``status`` that finds
        its pod ended and ``watch.json`` gone with it: the recovery's record, when, and the metrics file's
        events read to its end, of its checkpoints only those a resume names (a line of a few kB)."""
        with self._lock:
            while self.rec.metrics and self._read(self.rec.metrics) == self.CHUNK:
                pass
            out = self.state()
            named = {e.get("checkpoint_step", e.get("step")) for e in self.marks if e.get("event") == "resume"}
        listed = out.get("events")
        if isinstance(listed, list):
            out["events"] = [e for e in listed if not (isinstance(e, dict) and e.get("event") == "checkpoint"
                                                       and e.get("step") not in named)]
        return {**out, "updated": time.time()}

    def _read(self, path: str) -> int:
        """The next part of the metrics file read (at most ``CHUNK`` bytes): how many bytes it had."""
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read(self.CHUNK)
        except OSError:
            return 0
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            try:
                event: JSON = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("step"), int) and isinstance(event.get("time"), (int, float)):
                self._saw(event)
        return len(data)

    def _saw(self, event: JSONObject) -> None:
        kind = event.get("event", "step")
        if kind == "step":
            self.first = self.first or event
            if self.resumed:
                self.marks.append(event)
                self.resumed = False
            self.last_step = event
        elif kind == "resume":
            if self.last_step is not None and self.last_step not in self.marks and self.last_step is not self.first:
                self.marks.append(self.last_step)
            self.marks.append(event)
            self.resumed = True
        elif kind == "checkpoint":
            self.checkpoints = [*self.checkpoints[-(self.CHECKPOINTS - 1):], event]


def _time(event: JSONObject) -> float:
    """An event's ``time`` (``_read`` keeps only events whose ``time`` is a number)."""
    t = event.get("time")
    return float(t) if isinstance(t, (int, float)) else 0.0
