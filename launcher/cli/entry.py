"""The ``ddpjob`` command's entry point.

Loading the CLI takes a tenth of a second or so; a Ctrl-C in that window is a quiet exit 130 like a
Ctrl-C anywhere else, not a traceback from whichever module Python was importing.
"""

from __future__ import annotations

# Only what Python has loaded already (gc, sys) at the top: until main()'s own handling begins, a
# Ctrl-C gives Python's traceback, so this module keeps that window to the interpreter's own
# start-up (typing alone takes ~5 ms to load; it and types are imported where used).
import gc
import sys

PYDANTIC_PLUGIN_LOADER = "pydantic.plugin._loader"


def without_pydantic_plugins() -> None:
    """Tell pydantic, in the ``ddpjob`` process only, that no pydantic plugin is installed.

    The first time a model class is built, pydantic imports ``importlib.metadata`` and scans every
    installed distribution's entry points for plugins. Pydantic plugins observe validation (logfire,
    for one); the CLI validates only ddpjob's own spec models, which nobody instruments. So the
    command behaves as with ``PYDANTIC_DISABLE_PLUGINS=__all__``, without paying for the import. The
    Python API (``launcher.api``) runs inside the user's program and leaves pydantic alone.
    Measured gain (tests/bench/cli_bench.py ``tricks``, ``pydantic_plugin_standin``): 15-20 ms of
    ``ddpjob render``'s ~0.13 s, nothing on ``--help``.
    """
    if PYDANTIC_PLUGIN_LOADER in sys.modules:  # pydantic is already in use here: leave it as it is
        return
    import types

    loader = types.ModuleType(PYDANTIC_PLUGIN_LOADER, "ddpjob: no pydantic plugins in the CLI process")
    loader.get_plugins = lambda *args, **kwargs: ()  # type: ignore[attr-defined]
    sys.modules[PYDANTIC_PLUGIN_LOADER] = loader


# Collect when this many objects have been allocated and not freed (Python's default: 700).
GC_THRESHOLDS = (50_000, 10, 10)


def fewer_collections() -> None:
    """Let the cyclic garbage collector run rarely in the ``ddpjob`` process.

    Loading click, pydantic and PyYAML and building the spec model allocates a few hundred thousand
    objects, nearly all of which live until the command ends; with the default thresholds the
    collector walks them again and again, and once more when the interpreter shuts down. Running it
    every 50,000 allocations instead, and freezing what exists at exit, is the measured gain of
    tests/bench/cli_bench.py ``tricks`` (``gc_tuning``): 8-13 ms of ``--help``, 27-45 ms of
    ``render``. The collector still runs, so a ``logs -f`` that follows for days stays bounded in
    memory. The Python API leaves the user's process alone.
    """
    gc.set_threshold(*GC_THRESHOLDS)


def interrupts_never_lost() -> None:
    """A Ctrl-C that lands in code Python runs on the side (a weakref callback of the import system,
    a finalizer) is printed as "Exception ignored ... KeyboardInterrupt" and dropped; in the
    ``ddpjob`` process it is delivered again instead, where it stops ddpjob (or is held) as usual."""
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            import _thread
            import signal
            import threading
            import time

            main_thread = threading.main_thread().ident
            assert main_thread is not None  # the main thread has started: this code runs in it

            def again() -> None:  # from another thread, once the main one has left this hook
                time.sleep(0.001)  # (a signal sent from here would raise inside it, and be dropped again)
                signal.pthread_kill(main_thread, signal.SIGINT)  # a real signal: it ends a blocking wait too

            try:
                _thread.start_new_thread(again, ())
            except RuntimeError:  # the interpreter is shutting down: ddpjob is ending anyway
                pass
            return
        previous(unraisable)

    sys.unraisablehook = hook


def main() -> None:
    try:
        interrupts_never_lost()
        fewer_collections()
        without_pydantic_plugins()
        from launcher.cli.main import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("\nStopped.\n")
        sys.exit(130)
    finally:
        # Whatever is left is freed by the process's exit; the collector need not walk it first.
        gc.freeze()


if __name__ == "__main__":
    main()
