"""``plan.json`` as a typed record: the parts of a job's plan that code other than the target that wrote
it reads (issue 46 item 1). Its one reader is ``read_plan_record``; its writer is the target's payload
(``to_json``) through ``RunFolder.write_plan``, unchanged.

What the others read, by the names on disk (those of every version so far)::

    {"elements": [{"index": 0, "params": {"lr": "0.1"}, "output_dir": "/runs/j/output",
                   "nodes": [{"log": ".../task-0/node-0.log", "torchrun_log_dir": ".../task-0/torchrun-node-0"}]}]}

Each element is one run (a sweep element); ``nodes`` only where the target runs them from this machine
(local: Slurm's elements have none, k8s plans have no ``output_dir``). ``version``: the layout's number;
absent in every file written so far (``PLAN_VERSION`` 1); a layout that changes what is read here writes a
higher one. A key missing or of another type reads as its default: a plan from an older ddpjob, or
another target's, reads as far as it says.

Standard library only, no dataclasses (the same rule as ``runfolder.py``).
"""

from __future__ import annotations

import os

PLAN_VERSION = 1


class PlanNode:
    """One node of a run: its log and torchrun's log folder (``--log-dir``), where the plan names them."""

    __slots__ = ("log", "torchrun_log_dir")

    def __init__(self, log: str, torchrun_log_dir: str | None = None) -> None:
        self.log, self.torchrun_log_dir = log, torchrun_log_dir


class PlanElement:
    """One run: its index, its sweep values as text, its output folder (``DDPJOB_OUTPUT_DIR``) and,
    where the plan lists them, its nodes (None where it does not)."""

    __slots__ = ("index", "nodes", "output_dir", "params")

    def __init__(self, index: int | None, params: dict[str, str], output_dir: str | None,
                 nodes: list[PlanNode] | None) -> None:
        self.index, self.params, self.output_dir, self.nodes = index, params, output_dir, nodes


class PlanRecord:
    """What ``plan.json`` says of a job's runs to readers other than its target."""

    __slots__ = ("elements", "version")

    def __init__(self, version: int, elements: list[PlanElement]) -> None:
        self.version, self.elements = version, elements

    def metrics_dirs(self) -> list[str]:
        """The output folders, in the runs' order, of the runs that name one."""
        return [el.output_dir for el in self.elements if el.output_dir]

    def startup_files(self) -> list[list[tuple[str, str]]]:
        """Per run that lists its nodes, per node that names both: (its log, its torchrun log folder)."""
        return [[(n.log, n.torchrun_log_dir) for n in el.nodes if n.torchrun_log_dir is not None]
                for el in self.elements if el.nodes is not None]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _node(data: object) -> PlanNode | None:
    if not isinstance(data, dict) or not isinstance(data.get("log"), str):
        return None
    return PlanNode(data["log"], _text(data.get("torchrun_log_dir")))


def _element(data: dict[str, object]) -> PlanElement:
    index, params, nodes = data.get("index"), data.get("params"), data.get("nodes")
    return PlanElement(
        index if isinstance(index, int) and not isinstance(index, bool) else None,
        {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {},
        _text(data.get("output_dir")),
        [n for n in map(_node, nodes) if n is not None] if isinstance(nodes, list) else None)


def parse_plan(data: object) -> PlanRecord | None:
    """``plan.json``'s data as the record; None when it is not a mapping (not a plan)."""
    if not isinstance(data, dict):
        return None
    version, elements = data.get("version"), data.get("elements")
    return PlanRecord(version if isinstance(version, int) else PLAN_VERSION,
                      [_element(el) for el in elements if isinstance(el, dict)] if isinstance(elements, list) else [])


def read_plan_record(run_dir: str | os.PathLike[str]) -> PlanRecord | None:
    """The plan of the job whose run folder is ``run_dir``; None where it has no readable ``plan.json``."""
    from launcher.targets.shared.runfolder import RunFolder

    return parse_plan(RunFolder(run_dir).read_plan())
