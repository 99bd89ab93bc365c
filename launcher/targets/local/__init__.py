"""The local target: N torchrun agents on this machine, one per simulated node, under a detached
supervisor (``job/supervisor.py``: what runs in the job is in ``job/``). ``options.py`` is the spec's ``local:`` section, ``payload.py`` the
payload, its text and the handle, ``target.py`` the plan, submit, status, logs and cancel. Nothing is imported here, so the package costs nothing."""
