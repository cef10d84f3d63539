"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: code that must not read the device from
the host (so that a CUDA graph can hold it) is run with every such read from trtforge code made an error.

Where a tensor's values reach the host (``.item()``, ``.tolist()``, ``int(t)``, ``if t:``, ``.numpy()``)
or an op's output size is data (``bincount``, ``nonzero``, ``unique``, ``masked_select``,
``repeat_interleave``), a CUDA stream would stall; on the CPU nothing stalls, so the trap raises instead
when the direct caller is a ``trtforge`` module (Triton's interpreter and torch's own Python stay free).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest
import torch

_METHODS = ("item", "tolist", "numpy", "__bool__", "__int__", "__index__", "__float__", "nonzero", "unique")
_FUNCTIONS = ("bincount", "nonzero", "unique", "masked_select", "repeat_interleave", "unique_consecutive")


class HostSyncError(AssertionError):
    """A device value read by the host (or a data-dependent size) in code that must not have one."""


def _trap(owner: object, name: str, original):
    def trapped(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("trtforge"):
            raise HostSyncError(f"{caller} calls {name}, which reads device values on the host")
        return original(*args, **kwargs)

    return trapped


@contextlib.contextmanager
def no_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Within the block, a host read of tensor values or a data-sized op called from trtforge raises
    :class:`HostSyncError`."""
    with monkeypatch.context() as m:
        for name in _METHODS:
            m.setattr(torch.Tensor, name, _trap(torch.Tensor, name, getattr(torch.Tensor, name)))
        for name in _FUNCTIONS:
            m.setattr(torch, name, _trap(torch, name, getattr(torch, name)))
        yield
