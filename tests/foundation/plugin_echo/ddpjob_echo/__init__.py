"""echo: a target of its own, from a package that is not ddpjob (tests/foundation/test_found_plugins.py
builds it into a wheel and installs it beside ddpjob). It runs the spec's command once, on this
machine, detached: ``options.py`` (its spec section and its ``TargetPlugin``), ``target.py``."""
