"""Atomic file output: write to a temporary file beside the target, then rename over it.

A crash or an exception never leaves a partial or corrupted output file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trtforge.errors import UserError


def check_output_path(path: str | os.PathLike[str], *, force: bool, what: str = "output") -> Path:
    """Validate that `path` can be written: parent exists and is writable, no clobbering without force."""
    p = Path(path)
    if p.exists() and not force:
        raise UserError(f"{what} '{p}' already exists; pass --force (force=True) to overwrite it.")
    if p.exists() and p.is_dir():
        raise UserError(f"{what} '{p}' is a directory; expected a file path.")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write {what} '{p}': directory '{parent}' does not exist.")
    try:  # a real probe: os.access says yes to root even on read-only or special filesystems
        fd, probe = tempfile.mkstemp(prefix=".trtforge-probe-", dir=parent)
    except OSError as e:
        raise UserError(
            f"cannot write {what} '{p}': directory '{parent}' is not writable ({e.strerror})."
        ) from e
    os.close(fd)
    os.unlink(probe)
    return p


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO]:
    """Open a temp file next to `path` for writing; rename it onto `path` only if the block succeeds."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview) -> None:
    """Write `data` to `path` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_open(path, "w") as f:
        f.write(text)


def sha256_bytes(data: bytes | memoryview) -> str:
    """Hex sha256 of a buffer."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
