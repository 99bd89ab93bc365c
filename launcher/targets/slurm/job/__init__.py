"""What runs on a Slurm job's nodes: each node's runner (``node.py``, unpickled by submitit) with the plain
data it is given and what a node makes of it (``nodeplan.py``: ``SlurmCommon``, ``SlurmElement``, each
node's paths, torchrun argv and env, which ``payload.py`` renders too), a run
that goes on without a lost node (``recover.py``), the per-task variables of an oci container
(``task_env.py``), the node list they read (``nodelist.py``) and what stops the processes a run left
running (``reaper.py``). At module top they import only the standard library, this wing and the shared
in-job modules (tests/foundation/test_found_wing.py holds it). Nothing is imported here."""
