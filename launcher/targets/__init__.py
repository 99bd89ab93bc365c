"""Targets: where a job runs.

Every target is a plugin (``launcher.core.plugins``): an entry point of the group ``ddpjob.targets`` names
its ``TargetPlugin`` (its ``Target`` class, its spec section's options model, one line of summary, its
docs page). The three built-in targets are packages here, ``local``, ``slurm`` and ``k8s``, registered by
ddpjob's own ``pyproject.toml`` in the same way; each holds its spec section and its ``TargetPlugin``
(``options.py``), its plan/render, submit, status and logs (``target.py``). Finding the names imports no
target (the CLI does it for ``--target``); a target's modules are imported when that target is used
(``lookup.get_target``). The spec builds its sections from the plugins (``spec.model.spec_model``) and
imports nothing of this package.

Beside the targets: the target interface and its plan, context and handle (``base``), what only some
targets do (``capabilities``), what ``status`` returns (``jobstatus``), a target looked up by name
(``lookup``) and held by the service with a recorded job (``chosen``); the pieces the targets share (``shared``) and one package per built-in target
(``local``, ``slurm``, ``k8s``).

Adding a target: a package of your own (docs/targets.md, "A target of your own"), or a package here
(ARCHITECTURE.md, "Adding a target", lists what the tests ask of a built-in one).
"""
