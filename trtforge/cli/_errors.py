"""Map exceptions to exit codes and one-paragraph messages.

UserError, an OSError about the user's filesystem (disk full, name too long, permissions) and a click
usage error -> 2; Ctrl-C -> 130 and SIGTERM -> 143 (128 + the signal, after the same cleanup); stdout's
reader gone (`trtforge generate ... | head -1`) -> 141 without a message, as a unix tool ended by SIGPIPE;
any other exception -> 1 with its trace, because that one is a trtforge bug.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import click

from trtforge._fileio import USER_ERRNOS, os_error
from trtforge._usercode import describe, user_frame
from trtforge.errors import TrtforgeError, TrtforgeWarning, UserError

EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_SIGPIPE = 128 + getattr(signal, "SIGPIPE", 13)  # (13 on every unix; Windows has no SIGPIPE)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, docker and systemd send), raised like Ctrl-C so the same cleanup runs."""


def _importing(frame: Any) -> bool:
    """Whether `frame` runs inside an import: a module's top-level code under importlib's machinery."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _signals_as_interrupts(received: list[int]) -> Iterator[None]:
    """While the command runs (main thread only), record SIGINT/SIGTERM in `received` and raise
    KeyboardInterrupt / :class:`Terminated`. The record matters because an interrupt can be swallowed
    on the way (a library's optional-import guard); the exit code still says it was interrupted.

    Two places are unsafe to raise in, so the interrupt is raised again 10 ms later (a timer signal)
    until the command's own code runs:
    - an import: a native extension's module initialization calls back into Python, and an exception
      thrown through it aborts or crashes the process (torch's, mid-import: `terminate called after
      throwing pybind11::error_already_set`, exit by SIGABRT). A second signal during an import is raised
      at once: a user's module doing long work at import time stays interruptible.
    - a finalizer (__del__, a weakref callback: a closed engine, a loader's thread pool collected),
      where Python ignores the exception and the command ran on to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    active = [True]  # False once the command has ended: a late signal is recorded, not raised
    alarm: list[Any] = []  # SIGALRM's own handler, once ours replaced it
    pending = [False]  # an interrupt is due at the next timer signal
    held = [False]  # ... held back by an import

    def later() -> bool:
        """Raise the recorded interrupt in 10 ms (False where this platform has no timer signal)."""
        if not hasattr(signal, "setitimer"):
            return False
        if not alarm:
            alarm.append(signal.signal(signal.SIGALRM, on_alarm))
        pending[0] = True
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return True

    def raise_now(signum: int) -> None:
        held[0] = pending[0] = False
        if alarm:  # no timer left to raise a second time inside the cleanup
            signal.setitimer(signal.ITIMER_REAL, 0)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        if not active[0]:
            return
        if not held[0] and _importing(frame) and later():
            held[0] = True
            return
        raise_now(signum)  # (a second signal while one is held: at once)

    def on_alarm(_signum: int, frame: Any) -> None:
        if not (pending[0] and active[0] and received):
            return
        if held[0] and _importing(frame):
            later()
            return
        raise_now(received[-1])

    hook = sys.unraisablehook

    def on_unraisable(unraisable: Any) -> None:
        """An interrupt raised inside a finalizer is ignored by Python: raise it again where the main
        thread runs (raised here, it would be ignored again)."""
        swallowed = received and active[0] and isinstance(unraisable.exc_value, KeyboardInterrupt)
        main = threading.current_thread() is threading.main_thread()  # (where signal handlers are set)
        if not swallowed or not main or not later():
            hook(unraisable)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.unraisablehook = on_unraisable
    try:
        yield
    finally:
        active[0] = False
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, alarm[0])
        sys.unraisablehook = hook
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Show trtforge's own warnings (:class:`TrtforgeWarning`) as one ``warning: ...`` line on stderr,
    every time, rather than Python's file:line form once per place; others as Python shows them."""
    show = warnings.showwarning

    def on_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, TrtforgeWarning):
            click.secho(f"warning: {message}", fg="yellow", err=True)
        else:
            show(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("always", TrtforgeWarning)
        warnings.showwarning = on_warning
        yield


@contextlib.contextmanager
def _tensorrt_warnings_as_lines() -> Iterator[None]:
    """Show TensorRT's warnings (the ``trtforge.tensorrt`` log, :data:`trtforge.core.backend.TRT_LOG`) as
    ``warning: TensorRT: ...`` lines on stderr. Its INFO and VERBOSE messages stay in the log (a normal
    build prints nothing of them); its errors too: a build that fails raises them as the command's error,
    and one that recovers (an attention layer retried decomposed) says so in its own output."""
    from trtforge.core.backend import TRT_LOG as log  # (no TensorRT import: the adapter imports it lazily)

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING:
                click.secho(f"warning: TensorRT: {record.getMessage()}", fg="yellow", err=True)

    handler = Lines(logging.WARNING)
    log.addHandler(handler)
    level = log.level
    if not log.isEnabledFor(logging.WARNING):
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _safe_streams() -> None:
    """Never fail to print a message: undecodable bytes (a non-UTF-8 path) are shown escaped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def _interrupted(signum: int) -> int:
    click.echo("\nterminated" if signum == signal.SIGTERM else "\ninterrupted", err=True)
    return 128 + signum


def run_cli(group: click.Group, argv: list[str] | None) -> int:
    """Run `group` standalone=False and translate failures; never swallows: internal errors print a trace."""
    _safe_streams()
    received: list[int] = []
    try:
        with _signals_as_interrupts(received), _warnings_as_lines(), _tensorrt_warnings_as_lines():
            rv = group.main(args=argv, prog_name="trtforge", standalone_mode=False)
            sys.stdout.flush()  # a pipe's last buffered lines: a reader gone shows here, not at exit
    except BaseException as e:
        if isinstance(e, click.exceptions.Abort) and isinstance(e.__cause__, (KeyboardInterrupt, EOFError)):
            # click turns Ctrl-C, and an EOFError from anywhere (a truncated file), into Abort
            e = e.__cause__
        if received or isinstance(e, KeyboardInterrupt):
            return _interrupted(received[0] if received else _signal_of(e))
        if _stdout_closed_by_reader(e):
            return _reader_gone()
        if not isinstance(e, Exception):
            raise  # SystemExit and the like: not ours to translate
        return _exit_code(e)
    if received:  # the interrupt was swallowed on the way (see _signals_as_interrupts)
        return _interrupted(received[0])
    # With standalone_mode=False, click returns the code of `ctx.exit(n)` instead of raising.
    return rv if isinstance(rv, int) else 0


def _stdout_closed_by_reader(e: BaseException) -> bool:
    """Whether `e` ended the command because stdout's reader went away (`| head -1` read its line).

    click catches an EPIPE OSError itself, even with standalone_mode=False, and exits 1 without a word
    (SystemExit(1), the OSError gone); our own final flush raises BrokenPipeError. Either way stdout is
    asked whether its reader is gone, so an EPIPE from some other pipe or socket is not mistaken for it."""
    broken = isinstance(e, SystemExit) or (isinstance(e, OSError) and e.errno == errno.EPIPE)
    return broken and _stdout_reader_gone()


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reading end is closed (poll reports an error or a hangup
    for its writing end; a file or a terminal never does)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no file descriptor, or no poll on this platform
        return False
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _reader_gone() -> int:
    """Stop quietly, as a unix tool ended by SIGPIPE, with its exit code (141). Python's own advice for
    a broken pipe: point stdout at /dev/null, so the interpreter's last flush of what is still buffered
    does not fail again ("Exception ignored ... BrokenPipeError", exit 120)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    return EXIT_SIGPIPE


def _signal_of(e: BaseException) -> int:
    return signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT


def _exit_code(e: Exception) -> int:
    """Print the one-paragraph message (or the trace of an internal error) and return the exit code."""
    if isinstance(e, click.exceptions.Exit):
        return int(e.exit_code or 0)
    if isinstance(e, click.exceptions.Abort):
        click.echo("aborted", err=True)
        return 1
    if isinstance(e, click.ClickException):
        e.show()
        return 2 if e.exit_code in (1, 2) else int(e.exit_code)
    if isinstance(e, TrtforgeError):
        click.secho(f"error: {e}", fg="red", err=True)
        return 2 if isinstance(e, UserError) else 1
    if isinstance(e, OSError) and e.errno in USER_ERRNOS:
        if e.filename is None and _writing_stdout(e):  # (`inspect --json > /dev/full` said "cannot use '?'")
            click.secho(f"error: cannot write the standard output: {e.strerror or e}.", fg="red", err=True)
        else:
            click.secho(f"error: {os_error(e, e.filename or '?', 'use')}", fg="red", err=True)
        return 2
    frame = user_frame(e)
    if frame is None:
        return _internal()
    click.secho(f"error: your code raised {describe(e)} (at {frame}).", fg="red", err=True)
    return 2


def _writing_stdout(e: OSError) -> bool:
    """Whether `e` was raised writing the standard output: by the last flush (run_cli) or on the way
    through click.echo or a rich console (an OSError of sys.stdout names no file)."""
    tb = e.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if not frames:
        return False
    if frames[-1].f_code.co_name == "run_cli":  # raised by run_cli's own flush of sys.stdout
        return True
    for frame in frames:
        where, function = frame.f_code.co_filename.replace(os.sep, "/"), frame.f_code.co_name
        if where.endswith("click/utils.py") and function == "echo":
            return frame.f_locals.get("err") is not True
        if where.endswith("rich/console.py"):
            return not getattr(frame.f_locals.get("self"), "stderr", False)
    return False


def _internal() -> int:
    traceback.print_exc()
    click.secho("internal error (the trace above); please report it.", fg="red", err=True)
    return 1


def build_thread_alive() -> bool:
    """True while a cancelled TensorRT build is still winding down in its worker thread."""
    build = sys.modules.get("trtforge.compiler.build")
    name = getattr(build, "BUILD_THREAD_NAME", None)
    return name is not None and any(t.name == name and t.is_alive() for t in threading.enumerate())
