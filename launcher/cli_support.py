"""What every ``ddpjob`` command shares: typed errors turned into a message and an exit code,
Ctrl-C turned into exit 130. Imports only click."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

DEBUG = {"on": bool(os.environ.get("DDPJOB_DEBUG"))}


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"ddpjob: error: {message}", err=True)
    sys.exit(code)


def interrupted(e: BaseException) -> bool:
    """Whether a KeyboardInterrupt is the cause (or context) of ``e``."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn ddpjob's typed errors into a message and an exit code; never a traceback for them."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from launcher.errors import DdpjobError, SpecError

        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            click.echo(e.render(), err=True)
            sys.exit(e.exit_code)
        except DdpjobError as e:
            if DEBUG["on"]:
                raise
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            click.echo("\nStopped.", err=True)
            sys.exit(130)
        except (click.exceptions.Exit, click.ClickException, SystemExit, BrokenPipeError):
            raise
        except Exception as e:  # an unexpected error is a bug: say so, keep the details one flag away
            if interrupted(e):  # Ctrl-C inside code that wraps exceptions (e.g. class creation)
                click.echo("\nStopped.", err=True)
                sys.exit(130)
            if DEBUG["on"]:
                raise
            fail(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", 70)

    return wrapper
