"""The job spec: from YAML text to a validated ``JobSpec``.

Owns the pydantic models (``model``), the bounded YAML reader that refuses costly or unsafe input
before parsing (``yamlread``), the loader that maps every problem to file, line and field
(``load``), secret values masked for display (``secrets``) and the example specs shipped as package
data (``examples``). May import ``launcher.core`` only: each target's spec section comes from its
plugin (``launcher.core.plugins``, loaded by name), so it knows no target's behaviour, nor the
registry or the command line.
"""
