"""The local target: N torchrun agents on this machine, one per simulated node, under a detached
supervisor (``job/supervisor.py``: what runs in the job is in ``job/``). ``options.py`` is the spec's
``local:`` section, ``payload.py`` the payload, its text and the handle, ``target.py`` the plan, submit,
status, logs and cancel, ``status.py`` a job's status from the supervisor's state and the nodes' exit
records, ``watch.py`` the stall watch's file read back; a free rendezvous port (``ports.py``) and a
start again on another when one is taken before the bind (``portmove.py``); nodes in containers
(``container.py``) and on a bridge network of the job's own (``network.py``). Nothing is imported here,
so the package costs nothing."""
