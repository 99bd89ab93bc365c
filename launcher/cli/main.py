"""The ``ddpjob`` command line. Click commands only: heavy imports happen inside each command.

Exit codes: ``launcher.core.exitcodes.EXIT_CODES`` (listed by ``ddpjob --help`` and docs/commands.md).
"""

from __future__ import annotations

import os
import signal
import sys

import click

from launcher.cli.commands import COMMANDS
from launcher.cli.docs import pages_help
from launcher.cli.support import DEBUG, exit_codes_help, flush_stdout


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=f"{pages_help()}\n\n{exit_codes_help()}")
@click.version_option(package_name="ddpjob", prog_name="ddpjob")
@click.option("--debug", is_flag=True, help="Show full tracebacks for unexpected errors (or set DDPJOB_DEBUG=1).")
def cli(debug: bool) -> None:
    """Launch PyTorch DDP training from one spec, on this machine, Slurm or Kubernetes.

    \b
    Quick start:
      ddpjob init                                    # writes ./quickstart.yaml (ddpjob init --list)
      ddpjob submit quickstart.yaml --target local --nodes 2 -f
      ddpjob submit --target local --nodes 2 -- python train.py --lr 0.1
      ddpjob render quickstart.yaml --target k8s     # what would be submitted
      ddpjob list;  ddpjob status ID;  ddpjob logs ID -f;  ddpjob cancel ID

    Jobs are recorded under $DDPJOB_HOME (default ~/.ddpjob), so any later shell can follow them.
    """
    if debug:
        DEBUG["on"] = True


for _command in COMMANDS:  # the one list of the commands: launcher/cli/commands.py
    cli.add_command(_command)


def main() -> None:
    from launcher.core.home import private_files

    private_files()  # the registry, plans and logs may hold secrets (the jobs inherit the umask too)
    try:
        # standalone_mode=False: a Ctrl-C before a command's own handling (while click parses) is
        # exit 130 like any other, not click's "Aborted!" with exit 1.
        try:
            code = cli.main(prog_name="ddpjob", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("\nStopped.", err=True)
            sys.exit(130)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)
    except SystemExit:
        # The command is done: a Ctrl-C now would only lose buffered output (a printed job id).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        flush_stdout()  # here, not at interpreter exit, so a reader that left means exit 0
        raise
    except BrokenPipeError:
        # `ddpjob logs ID | head`: the reader left; not an error. Keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    main()
