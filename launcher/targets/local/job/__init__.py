"""What runs inside a local job: the supervisor (``supervisor.py``), which starts a run's nodes
(``starts.py``, with the secret env values that came in its environment, ``secretenv.py``) and brings a
run back after a lost node (``recover.py``), each node's wrapper (``node.py``), the job's ``state.json``
(its typed record, one reader and one writer, in ``staterecord.py``; kept when the disk is full by
``statefile.py``) and its nodes' cgroups (``cgroups.py``). Started as
``python -I -S``: at module top they import only the standard library, this wing and the shared
in-job modules (tests/foundation/test_found_wing.py holds it). Nothing is imported here."""
