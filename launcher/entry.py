"""The ``ddpjob`` command's entry point.

Loading the CLI takes a tenth of a second or so; a Ctrl-C in that window is a quiet exit 130 like a
Ctrl-C anywhere else, not a traceback from whichever module Python was importing.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from launcher.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("\nStopped.\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
