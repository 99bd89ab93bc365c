"""What every ``ddpjob`` command shares: typed errors turned into a message and an exit code,
Ctrl-C turned into exit 130, a reader that went away (``| head``) into a quiet exit 0, and the
machine's own refusals (a full disk, a read-only folder) into exit 3. Imports only click."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import NoReturn, ParamSpec, TypeVar

import click

P = ParamSpec("P")
R = TypeVar("R")
DEBUG = {"on": bool(os.environ.get("DDPJOB_DEBUG"))}


class Seconds(click.FloatRange):
    """A number of seconds within a range (a refresh interval); ``nan`` is refused too, which a
    ``FloatRange`` lets by (every comparison with it is false) and ``time.sleep`` would not take."""

    def convert(self, value: float, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds = float(super().convert(value, param, ctx))
        if seconds != seconds:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


def exit_codes_help() -> str:
    """The exit-code table for ``ddpjob --help`` (from ``launcher.core.exitcodes.EXIT_CODES``)."""
    from launcher.core.exitcodes import EXIT_CODES

    rows = "\n".join(f"  {code:<5}{text}" for code, text in EXIT_CODES.items())
    return f"\b\nExit codes:\n{rows}"


def stdout_gone() -> bool:
    """Whether the reader of stdout has gone away (a pipe whose other end is closed)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return True  # no usable stdout at all


def closed_stdout() -> NoReturn:
    """``ddpjob logs ID | head -1``: the reader left, which is not an error. Exit 0 quietly, with
    stdout pointed at /dev/null so that Python's own flush at exit does not complain."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(0)


def flush_stdout() -> None:
    """Flush what is buffered; a reader that left is a quiet exit 0."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        closed_stdout()


def os_cause(e: OSError) -> str:
    """``/path: No space left on device`` (or what the error says)."""
    if e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}" + (f" -> {e.filename2}" if e.filename2 else "")
    return e.strerror or str(e)


def fail(message: str, code: int) -> NoReturn:
    from launcher.core.tokens import mask_shapes  # a credential quoted in a message is never shown

    click.echo(f"ddpjob: error: {mask_shapes(message)}", err=True)
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


def guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn ddpjob's typed errors into a message and an exit code; never a traceback for them."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from launcher.core.errors import DdpjobError, SpecError

        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            from launcher.core.tokens import mask_shapes  # a credential quoted in a message is never shown

            click.echo(mask_shapes(e.render()), err=True)
            sys.exit(e.exit_code)
        except DdpjobError as e:
            if DEBUG["on"]:
                raise
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            click.echo("\nStopped.", err=True)
            sys.exit(130)
        except BrokenPipeError as e:
            if stdout_gone():
                closed_stdout()
            if DEBUG["on"]:
                raise
            fail(os_cause(e), 3)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except OSError as e:  # the machine said no (full disk, read-only folder, missing directory): not a bug
            if DEBUG["on"]:
                raise
            fail(os_cause(e), 3)
        except Exception as e:  # an unexpected error is a bug: say so, keep the details one flag away
            if interrupted(e):  # Ctrl-C inside code that wraps exceptions (e.g. class creation)
                click.echo("\nStopped.", err=True)
                sys.exit(130)
            if DEBUG["on"]:
                raise
            fail(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", 70)

    return wrapper
