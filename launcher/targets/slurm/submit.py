"""Submission through submitit. Imported only by ``SlurmTarget.submit`` (it imports submitit).

``DdpjobExecutor`` is submitit's ``SlurmExecutor`` with two changes:
- arrays are submitted by this executor itself (submitit's own array path builds a fresh
  ``SlurmExecutor`` and so loses a custom ``python``, e.g. the container's interpreter);
- ``sbatch`` runs under ``timeout`` so a stuck controller cannot hang ``ddpjob submit``.
Pickling, the sbatch script, job ids and preemption handling are submitit's.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from pathlib import Path

from submitit.core import core as submitit_core
from submitit.core import utils
from submitit.slurm import slurm as submitit_slurm

from launcher.targets.shared.runfolder import RunFolder
from launcher.targets.slurm.payload import SlurmPayload

SBATCH_TIMEOUT_S = 120


class RenderMismatch(RuntimeError):
    """submitit would write a different script than ddpjob rendered (e.g. SUBMITIT_PREEMPT_SIGNAL set)."""


class DdpjobExecutor(submitit_slurm.SlurmExecutor):
    """submitit's Slurm executor, with arrays that keep ``python`` and a bounded sbatch call."""

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["timeout", "-k", "5", str(SBATCH_TIMEOUT_S), "sbatch", str(submission_file_path)]

    def expected_script(self, map_count: int | None) -> str:
        """The script submitit will write for the next submission (the text it passes to sbatch)."""
        params = dict(self.parameters)
        if map_count is not None:
            params["map_count"] = map_count
        return submitit_slurm._make_sbatch_string(command=self._submitit_command_str, folder=self.folder, **params)

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]
                                      ) -> list[submitit_core.Job[object]]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeout_min = self.parameters.get("time", 5)
        pickle_paths = []
        for d in delayed_submissions:
            pickle_path = folder / f"{uuid.uuid4().hex}.pkl"
            d.set_timeout(timeout_min, self.max_num_timeout)
            d.dump(pickle_path)
            pickle_paths.append(pickle_path)
        n = len(delayed_submissions)
        self.parameters["map_count"] = n
        try:
            first_job = self._submit_command(self._submitit_command_str)
        finally:
            del self.parameters["map_count"]
        tasks_ids = list(range(first_job.num_tasks))
        jobs: list[submitit_core.Job[object]] = [submitit_slurm.SlurmJob(folder=self.folder, job_id=f"{first_job.job_id}_{a}", tasks=tasks_ids)
                for a in range(n)]
        for job, pickle_path in zip(jobs, pickle_paths):
            job.paths.move_temporary_file(pickle_path, "submitted_pickle")
        return jobs


def submit(payload: SlurmPayload) -> tuple[str, str]:
    """Submit the plan's runs (one job, or one array for a sweep). Returns (Slurm job id, script path).

    Raises ``RuntimeError`` if the script submitit would write differs from the rendered one, before
    anything is submitted.
    """
    from launcher.targets.slurm.job.node import NodeRunner

    c = payload.common
    ex = DdpjobExecutor(folder=c.job_dir, max_num_timeout=c.max_timeouts, python=c.submit_python)
    ex.update_parameters(**payload.executor_params)
    expected = ex.expected_script(payload.map_count)
    if expected != payload.script:
        import difflib

        diff = "".join(difflib.unified_diff(payload.script.splitlines(True), expected.splitlines(True),
                                             "rendered", "submitit"))
        raise RenderMismatch(f"the sbatch script submitit would write differs from the rendered plan:\n{diff}")
    runners = [NodeRunner(c, el) for el in payload.elements]
    # submitit prints sbatch's stderr before raising it; the error message carries it already.
    with contextlib.redirect_stderr(io.StringIO()):
        if payload.map_count is None:
            job = ex.submit(runners[0])
            return str(job.job_id), str(job.paths.submission_file)
        jobs = ex.submit_array(runners)
    array_id = str(jobs[0].job_id).split("_", 1)[0]
    return array_id, str(Path(RunFolder(c.job_dir).submission_script(array_id)))
