"""The objects a Kubernetes job is made of: the loop that builds them and the parts both APIs share
(``render``), the two APIs as data (``apis``), the flavour per API (``pytorchjob``, ``trainjob``)
paired with its checks (``flavours``), and the pod runner's bundle in the pod's env (``runner``).
Pure: no module here imports ``cluster/`` (tests/foundation/test_found_wing.py holds it). Nothing is
imported here."""
