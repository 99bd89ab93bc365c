"""What runs on a Slurm job's nodes: each node's runner (``node.py``, unpickled by submitit), the
per-task variables of an oci container (``task_env.py``) and the node list they read
(``nodelist.py``). At module top they import only the standard library, this wing and the shared
in-job modules (tests/foundation/test_found_wing.py holds it). Nothing is imported here."""
