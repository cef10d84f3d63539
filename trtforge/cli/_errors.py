"""Map exceptions to exit codes and one-paragraph messages.

UserError, an OSError about the user's filesystem (disk full, name too long, permissions) and a click
usage error -> 2; Ctrl-C -> 130 and SIGTERM -> 143 (128 + the signal, after the same cleanup); any other
exception -> 1 with its trace, because that one is a trtforge bug.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import click

from trtforge._fileio import USER_ERRNOS, os_error
from trtforge._usercode import describe, user_frame
from trtforge.errors import TrtforgeError, UserError

EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, docker and systemd send), raised like Ctrl-C so the same cleanup runs."""


def _on_sigterm(_signum: int, _frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` while the command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _safe_streams() -> None:
    """Never fail to print a message: undecodable bytes (a non-UTF-8 path) are shown escaped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def _interrupted(e: BaseException) -> int:
    click.echo("\ninterrupted" if not isinstance(e, Terminated) else "\nterminated", err=True)
    return EXIT_SIGTERM if isinstance(e, Terminated) else EXIT_SIGINT


def run_cli(group: click.Group, argv: list[str] | None) -> int:
    """Run `group` standalone=False and translate failures; never swallows: internal errors print a trace."""
    _safe_streams()
    try:
        with _sigterm_as_interrupt():
            rv = group.main(args=argv, prog_name="trtforge", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code or 0)
    except click.exceptions.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            return _interrupted(e.__cause__)
        click.echo("aborted", err=True)
        return 1
    except click.ClickException as e:
        e.show()
        return 2 if e.exit_code in (1, 2) else int(e.exit_code)
    except UserError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        return 2
    except TrtforgeError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        return 1
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except OSError as e:
        if e.errno not in USER_ERRNOS:
            return _internal()
        click.secho(f"error: {os_error(e, e.filename or '?', 'use')}", fg="red", err=True)
        return 2
    except Exception as e:
        frame = user_frame(e)
        if frame is None:
            return _internal()
        click.secho(f"error: your code raised {describe(e)} (at {frame}).", fg="red", err=True)
        return 2
    # With standalone_mode=False, click returns the code of `ctx.exit(n)` instead of raising.
    return rv if isinstance(rv, int) else 0


def _internal() -> int:
    traceback.print_exc()
    click.secho("internal error (the trace above); please report it.", fg="red", err=True)
    return 1


def build_thread_alive() -> bool:
    """True while a cancelled TensorRT build is still winding down in its worker thread."""
    build = sys.modules.get("trtforge.compiler.build")
    name = getattr(build, "BUILD_THREAD_NAME", None)
    return name is not None and any(t.name == name and t.is_alive() for t in threading.enumerate())
