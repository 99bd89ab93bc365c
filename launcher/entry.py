"""The ``ddpjob`` command's entry point.

Loading the CLI takes a tenth of a second or so; a Ctrl-C in that window is a quiet exit 130 like a
Ctrl-C anywhere else, not a traceback from whichever module Python was importing.
"""

from __future__ import annotations

import sys
import types

PYDANTIC_PLUGIN_LOADER = "pydantic.plugin._loader"


def without_pydantic_plugins() -> None:
    """Tell pydantic, in the ``ddpjob`` process only, that no pydantic plugin is installed.

    The first time a model class is built, pydantic imports ``importlib.metadata`` and scans every
    installed distribution's entry points for plugins: about 40 ms, a sixth of ``ddpjob render``
    (see tests/bench/cli_bench.py). Pydantic plugins observe validation (logfire, for one); the CLI
    validates only ddpjob's own spec models, which nobody instruments. So the command behaves as with
    ``PYDANTIC_DISABLE_PLUGINS=__all__``, without paying for the import. The Python API
    (``launcher.api``) runs inside the user's program and leaves pydantic alone.
    """
    if PYDANTIC_PLUGIN_LOADER in sys.modules:  # pydantic is already in use here: leave it as it is
        return
    loader = types.ModuleType(PYDANTIC_PLUGIN_LOADER, "ddpjob: no pydantic plugins in the CLI process")
    loader.get_plugins = lambda *args, **kwargs: ()  # type: ignore[attr-defined]
    sys.modules[PYDANTIC_PLUGIN_LOADER] = loader


def main() -> None:
    try:
        without_pydantic_plugins()
        from launcher.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("\nStopped.\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
