"""The Slurm target: one sbatch job (a job array for a sweep) submitted through submitit.

``options.py`` (the spec's ``slurm:`` section), ``payload.py`` (the payload: the sbatch script and per-node
command, pure text), ``target.py`` (plan, submit, status, logs, cancel), ``submit.py`` (submitit,
imported only to submit), ``query.py`` (sacct/squeue/scontrol) and ``job/node.py`` (what runs inside
the job on each node). Nothing is imported here, so the package costs nothing."""
