"""Pieces shared by the targets: the per-node torchrun launch (``launch``), files written
atomically and typed JSON records (``files``), log tailing (``logtail``), the root cause of a
failed node (``rootcause``) and local process helpers (``procs``). Targets never import each
other; what two of them need lives here."""
