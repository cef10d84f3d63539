"""Error types. A UserError is the user's to fix (bad file, option, input) and maps to exit code 2."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


class TrtforgeError(Exception):
    """Base class of every error trtforge raises on purpose."""


class UserError(TrtforgeError):
    """Bad input from the user: a file, tensor or option that is not what was expected (exit code 2)."""


class BackendUnavailableError(UserError):
    """No usable TensorRT backend is installed, or the requested one is missing."""


class ExportError(TrtforgeError):
    """torch -> ONNX export failed, or the exported graph disagrees with torch."""


class ModelNotExportable(ExportError, UserError):
    """The exporters refused the user's model (what they could not trace is in the model: Python control
    flow on tensor values, an op with no ONNX form), or the graph of the fallback tracer is not faithful
    to it: the model or its source is the user's to change (exit code 2)."""


class BuildError(TrtforgeError):
    """The TensorRT parser or builder rejected the network."""


class TrtforgeWarning(UserWarning):
    """Something the user should know that does not stop the run (the CLI prints it as one line)."""


SHOWN_CHARS = 40  # characters of a quoted value that an error message keeps


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error message quotes it, at most about `limit` characters plus its size.

    Bad input is echoed so its sender can find it, but a 1 MB string, a 4,300-digit integer or a list of
    a million ids echoed whole made an error message of that size (and an integer past Python's
    int-to-str limit raised instead). Short values read as their repr; longer ones keep their first
    `limit` characters, then ``… (N characters)``, ``… (N digits)`` or ``… (N items)``.
    """
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int) or _is_integer(value):
        return _shown_int(int(value), limit)
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        head = repr(value[:limit])
        return f"{head[:-1]}…{head[-1]} ({len(value):,} characters)"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return _shown_collection(value, limit)
    try:
        text = repr(value)
    except ValueError:  # a container holding an integer past the int-to-str limit
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


CLIPPED_CHARS = 300  # characters of another library's error text that a message passes on


def clipped(text: str, limit: int = CLIPPED_CHARS) -> str:
    """Another library's error text (Jinja's, xgrammar's) as a message passes it on: whole up to `limit`
    characters, else its start and its size. Such texts can quote what a client sent (a chat template's
    ``raise_exception`` of a message, a schema), so they are bounded as :func:`shown` bounds values."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def shown_name(name: str | int) -> str:
    """A field name or key as an error message's field path writes it: as it is, unless longer than
    :data:`SHOWN_CHARS` (a client's own dict key), then cut and quoted as :func:`shown` cuts it."""
    text = str(name)
    return text if len(text) <= SHOWN_CHARS else shown(text)


def is_int(value: Any) -> bool:
    """A Python or NumPy integer, not a bool: what an integer option of the API accepts."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    """Whether `value` is an integer scalar of another library (numpy's), which ``int()`` takes exactly."""
    return hasattr(value, "__index__") and not hasattr(value, "__len__") and hasattr(value, "dtype")


def _shown_int(value: int, limit: int) -> str:
    """An integer's decimal form, or its first `limit` digits and how many it has. Past ~40 digits it is
    never written whole (Python refuses past 4,300: ``sys.set_int_max_str_digits``)."""
    n = abs(value)
    sign = "-" if value < 0 else ""
    digits = int(n.bit_length() * math.log10(2)) + 1
    if digits > 1 and n < 10 ** (digits - 1):
        digits -= 1
    if digits <= limit:
        return sign + str(n)
    head = n // 10 ** (digits - limit)
    return f"{sign}{head}… ({digits:,} digits)"


def _shown_collection(value: Any, limit: int) -> str:
    """A list, tuple, set or dict as its first items that fit in `limit` characters, then how many it has
    (each item shown by :func:`shown`, so a huge item inside is cut too)."""
    is_dict = isinstance(value, dict)
    opening, closing = ("{", "}") if is_dict or isinstance(value, (set, frozenset)) else ("[", "]")
    if isinstance(value, tuple):
        opening, closing = "(", ")"
    parts: list[str] = []
    used = 0
    for item in value.items() if is_dict else value:
        part = f"{shown(item[0], limit)}: {shown(item[1], limit)}" if is_dict else shown(item, limit)
        parts.append(part)
        used += len(part) + 2
        if used > limit:
            break
    text = opening + ", ".join(parts) + closing
    if len(parts) == len(value) and len(text) <= limit:
        return text
    noun = ("entry" if is_dict else "item") if len(value) == 1 else ("entries" if is_dict else "items")
    return f"{text[:limit]}… ({len(value):,} {noun})"


def check_call(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    name: str,
    also: tuple[str, ...] = (),
) -> None:
    """UserError when `func(*args, **kwargs)` would not bind: an unknown option (with the close one
    suggested), a missing argument or too many positional ones; `also`: options the caller takes itself.
    Python's TypeError ("got an unexpected keyword argument") named no alternative, and an option
    forwarded through ``**options`` failed deep inside."""
    import difflib
    import inspect  # (here: `import trtforge` stays cheap)

    sig = inspect.signature(func)
    params = {n: p for n, p in sig.parameters.items() if n != "self"}
    known = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)] + list(also)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())  # (its caller checks those)
    for key in kwargs:
        if key not in known and not takes_any:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(
                f"{name}() has no option {shown(key)}{hint}; its options are: {', '.join(known)}."
            )
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise UserError(f"{name}(): {e}.") from None


def checked_call(func: _F) -> _F:
    """Decorate a public API function (or ``__init__``) so a call that does not bind is a UserError
    naming the argument (see check_call), not Python's TypeError."""
    name = func.__qualname__.removesuffix(".__init__")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TypeError:
            check_call(func, args, kwargs, name)  # raises when the call itself was wrong
            raise

    return wrapper  # type: ignore[return-value]
