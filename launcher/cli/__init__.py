"""The ``ddpjob`` command line: parse, call the service, print.

Owns the entry point (``entry``: Ctrl-C while loading, no pydantic plugin scan), the click commands
(``main``; the others in their own modules, listed in ``more``: ``tools`` for completion, rm,
prune, doctor and init, ``config``, ``results`` for results and plot, whose matplotlib drawing is
``figure``, ``rerun``, ``queue`` for list and cancel, what list prints once or with --watch in
``listing``), submitting and following a job with its stages and the Ctrl-C words (``follow``),
colour on a terminal (``colour``), ``-o json`` and ``-o yaml`` printed alike (``formats``), the spec
options shared by commands (``specopts``), errors turned into messages and exit codes (``support``)
and how status and list look (``show``). May import everything below it (``launcher.service``,
``launcher.spec``, ``launcher.doctor``, ``launcher.core``, and ``launcher.targets`` for target names
and the typed status and handles), but no target package: it reaches targets only through the service. At
start-up it imports click and the target names only; each command imports what it needs.
"""
