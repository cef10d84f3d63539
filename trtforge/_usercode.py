"""The boundary with the user's own code: modules named as `module:attr`, factories, forward passes on
example inputs, data functions. An exception raised on the other side is the user's to fix, so it
becomes a :class:`UserCodeError` (exit code 2) naming the callable and carrying the user's message.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from trtforge.errors import TrtforgeError, UserError


class UserCodeError(UserError):
    """The user's module, factory, model forward or data function raised (exit code 2)."""


def describe(e: BaseException) -> str:
    """`Type: first line of the message` (file and line for a SyntaxError)."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({e.filename}, line {e.lineno})"
    text = str(e).strip()
    first = text.splitlines()[0][:500] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run a block that calls into the user's code; its exceptions become UserCodeError naming `what`.

    trtforge's own errors and KeyboardInterrupt pass through unchanged.
    """
    try:
        yield
    except TrtforgeError:
        raise
    except (Exception, SystemExit) as e:
        raise UserCodeError(f"{what} raised {describe(e)}").with_traceback(None) from e


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """Import `package.module:name` (the current directory importable) and return that callable."""
    mod_name, sep, attr = str(spec).partition(":")
    mod_name, attr = mod_name.strip(), attr.strip()
    if not sep or not mod_name or not attr or not all(p.isidentifier() for p in mod_name.split(".")):
        raise UserError(
            f"{what} '{spec}' is not a 'package.module:name' reference (for example mypkg.models:make)."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name):
            raise UserError(
                f"cannot import module '{mod_name}' of {what} '{spec}': no module named '{e.name}' "
                "(is it on PYTHONPATH or in the current directory?)."
            ) from e
        raise UserCodeError(f"importing module '{mod_name}' of {what} '{spec}' raised {describe(e)}") from e
    except (Exception, SystemExit) as e:
        raise UserCodeError(f"importing module '{mod_name}' of {what} '{spec}' raised {describe(e)}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserError(f"{what} '{spec}': module '{mod_name}' has no callable '{attr}'.")
    return fn


def user_frame(e: BaseException) -> str | None:
    """`file:line in function` when the innermost traceback frame that is not the Python installation
    or its packages (torch, numpy, ...; compiled extensions too) is the user's code rather than trtforge's;
    else None. An error
    the user's code raised, directly or through a library it called, is theirs; one raised below a
    trtforge frame is trtforge's."""
    libraries = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    package = os.path.dirname(os.path.realpath(__file__)) + os.sep
    last: str | None = None
    tb = e.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        path = os.path.realpath(filename)
        # A relative name is a compiled extension's source (numpy's `numpy/random/_common.pyx`), not a file
        # of the user's: realpath would resolve it against the current directory.
        compiled = not os.path.isabs(filename)
        if filename.startswith("<") or compiled or any(path.startswith(r) for r in libraries):
            pass
        elif path.startswith(package):
            last = None
        else:
            last = f"{filename}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return last


def raised_by_trtforge(e: BaseException) -> bool:
    """Whether `e`, or an exception it was raised from or while handling, was raised by trtforge's own
    code by mistake: the innermost frame of its traceback is trtforge's, and it is none of trtforge's
    deliberate errors. (A library that refuses the user's model raises in the library's frames, or
    in the user's code it runs.)"""
    package = os.path.dirname(os.path.realpath(__file__)) + os.sep
    seen: set[int] = set()
    link: BaseException | None = e
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        tb = link.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        here = tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(package)
        if here and not isinstance(link, TrtforgeError):
            return True
        link = link.__cause__ or link.__context__
    return False


def load_factory(spec: str) -> tuple[Any, Any]:
    """Import `package.module:factory` (cwd importable) and call it; it must return (nn.Module, inputs).

    Whatever the user's module or factory raises is reported as theirs (UserCodeError, exit code 2).
    """
    if ":" not in spec:
        raise UserError(f"'{spec}' is not a model file nor a 'package.module:factory' reference.")
    factory = load_callable(spec, "factory")
    with user_code(f"factory '{spec}'"):
        result = factory()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UserError(
            f"factory '{spec}' must return (nn.Module, example_inputs); got {type(result).__name__}."
        )
    return result


@contextlib.contextmanager
def eval_mode(module: Any) -> Iterator[None]:
    """Run the body in eval mode (dropout off, BN frozen) and restore the caller's mode afterwards, module by
    module: `module.train(was_training)` would set every submodule to the top's flag, turning on the
    dropout of an eval-mode model inside a wrapper left in train mode (nn.Module's default). A module the
    body put in (a quantized layer replacing a Linear) takes its parent's restored mode. (Weak keys: a
    module the body drops is freed, and its id may be a new module's.)"""
    modes = weakref.WeakKeyDictionary((m, m.training) for m in module.modules())
    top = module.training
    module.eval()
    try:
        yield
    finally:
        restored: dict[str, bool] = {}
        for name, m in module.named_modules():
            parent = restored.get(name.rpartition(".")[0], top)
            m.training = restored[name] = modes.get(m, parent)
