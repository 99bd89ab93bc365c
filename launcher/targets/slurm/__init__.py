"""The Slurm target: one sbatch job (a job array for a sweep) submitted through submitit.

``options.py`` (the spec's ``slurm:`` section), ``payload.py`` (the payload: the sbatch script and per-node
command, pure text), ``target.py`` (plan, submit, status, logs, cancel), ``status.py`` (a job's status
from Slurm's records and its node runners'), ``submit.py`` (submitit, imported only to submit),
``query.py`` (sacct/squeue/scontrol), ``container.py`` (how each node's task starts in a container)
with ``bundles.py`` (the OCI bundles of ``slurm.container.runtime: oci``), and ``job/`` (what runs inside
the job on each node). Nothing is imported here, so the package costs nothing."""
