"""The service layer: the one path every entry point (the CLI, the Python API) walks with jobs.

Owns ``jobs`` (load -> target inputs -> reserve -> plan once -> submit -> record; status, list,
wait, logs, cancel), the SQLite registry of submitted jobs (``registry``), a submitted job's shape and
the checks of ``--task/--node/--rank`` against it (``shape``), removing finished jobs
(``cleanup``), each run's results read back from its metrics file (``results``), the
notification sent when a job ends (``notifier``; its watcher ``notifywatch``), the stage a
starting job is in (``stages``), the image a spec's ``build:`` pins before planning
(``imagebuild``), where a job's spec came from and the spec a rerun submits (``origin``) and the
queue view with its filters (``queue``). May import ``launcher.core``, ``launcher.spec`` and
``launcher.targets``; never the
command line (``launcher.cli``), so the API and the CLI behave alike.
"""
