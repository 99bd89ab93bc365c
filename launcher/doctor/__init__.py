"""``ddpjob doctor``: a real job that checks what the ranks see and how fast they all-reduce.

Owns the job's spec and the report's verdict (``run``, on the submitting side, through the service)
and the program every rank runs under torchrun (``probe``: ``python -m launcher.doctor.probe``,
standard library and torch). ``run`` may import ``launcher.core``, ``launcher.spec``,
``launcher.service`` and ``launcher.targets``; ``probe`` imports only ``launcher.targets.shared.netif``
and the trainer's device rule (``launcher.train.placement``), so both place ranks alike.
"""
