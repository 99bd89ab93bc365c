"""Images built from a spec's ``build:`` section: the context and its content hash (``context``),
with the ignore files' syntax (``ignores``), the secret-looking files every context leaves out
(``secretfiles``), the refusal of secret values that would go in (``secretvalues``) and the
content scan for secrets while the context is hashed (``secretscan``, its findings as the refusal in
``secretfound``); the engine's
build, push and registry look-ups (``engine``); and the pinned reference a job runs on (``pin``).
Part of the service: may import ``launcher.core``, ``launcher.spec`` and ``launcher.targets``, never
the command line. Registry credentials stay with the engine.
"""
