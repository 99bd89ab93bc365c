"""Pieces shared by the targets: the per-node torchrun launch (``launch``) and its NCCL/Gloo
environment (``dist``), files written atomically and typed JSON records (``files``), a job's run
folder and the one spelling of its file names (``runfolder``), what ``plan.json`` says of a job's runs to
readers other than its target, typed (``planrecord``), log tailing (``logtail``), the root
cause of a failed node (``rootcause``), local process helpers (``procs``), the checks before submit
(``preflight``), a starting job's stage (``stage``), the container engine's command line
(``container``). In the job, as every target's runner uses them: each node's interface check
(``netif``), the one runner core the three targets' runners start their vitals, stall watch and its stop
through (``jobcore``), the heartbeats between a run's nodes (``heartbeat``), each rank's vitals (``vitals``), the
straggler rule (``straggle``), a run's starts after a lost node (``restarts``) and what the first pod
says of them (``told``), every rank's Python stack (``stacks``, and through a shared job folder
``stackshare``). Read back by the client: a run's lost nodes and goodput (``recovery``) and the
per-rank record ``top`` and the dashboard show (``health``). Targets never import each other; what
two of them need lives here."""
