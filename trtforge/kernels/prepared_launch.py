"""A Triton launch prepared once and repeated with a few operands swapped (every layer of a serving step).

Each layer of a step launches the same attention kernels with the same grid, block tables, lengths
and constants; only the layer's q, K/V pools, output and scale differ. Going through the
``JITFunction`` each time re-binds some forty arguments, re-derives their specialization and looks
the compiled kernel up again, tens of microseconds of host time a launch. A :class:`PreparedLaunch`
does that once, on its first launch, and afterwards hands the compiled kernel's launcher the stored
argument list with the operands' pointers put in (as Triton's own ``JITFunction.run`` does after
its cache lookup), provided each pointer keeps the 16-byte alignment the kernel was specialized on;
otherwise, in Triton's interpreter and with ``TRTFORGE_BIND_LAUNCHES=0``, every launch goes through
the ``JITFunction``.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

__all__ = ["Operand", "PreparedLaunch", "arg_index"]


@dataclass(frozen=True)
class Operand:
    """How one per-launch input enters the kernel: as the arguments at `indices` (none: this kernel
    does not read it); a tensor as `view(input)` (None: as given), or, `scalar`, a float as given."""

    indices: tuple[int, ...] = ()
    view: Callable[[Any], Any] | None = None
    scalar: bool = False


@functools.lru_cache(maxsize=32)
def _parameters(kernel: Any) -> tuple[tuple[str, Any], ...]:
    """A Triton kernel's parameters in order, each with its default (a JITFunction or, under
    ``TRITON_INTERPRET``, an InterpretedFunction)."""
    return tuple((p.name, p.default) for p in inspect.signature(kernel.fn).parameters.values())


def arg_index(kernel: Any, name: str) -> int:
    """Position of parameter `name` in a Triton kernel's arguments."""
    return [p for p, _ in _parameters(kernel)].index(name)


def _bindable() -> bool:
    """Whether compiled kernels can be launched as :meth:`PreparedLaunch._launch_bound` does: the
    launcher convention of Triton 3.6's ``JITFunction.run`` (other versions, the interpreter and
    ``TRTFORGE_BIND_LAUNCHES=0`` launch through the JITFunction)."""
    version = tuple(int(x) for x in triton.__version__.split(".")[:2] if x.isdigit())
    knobs = getattr(triton, "knobs", None)
    return (
        version == (3, 6)
        and knobs is not None
        and not knobs.runtime.interpret
        and os.environ.get("TRTFORGE_BIND_LAUNCHES", "1") != "0"
    )


def _hooked(hook: Any) -> bool:
    """Whether a launch hook (a profiler's) is set: Triton 3.6 keeps a chain of them, never None."""
    return hook is not None and bool(getattr(hook, "calls", True))


class PreparedLaunch:
    """`kernel` over `grid` with `args` (positional, placeholders at the operands) and `kwargs`
    (constexprs and launch options); called with one input per `operands` entry. The inputs of every call
    must have the dtype, shape and strides of the first call's (the other arguments were computed
    from them): callers key their prepared launches by that geometry. `then` runs after it with
    the same inputs (a second kernel of the same launch, e.g. a split reduction)."""

    def __init__(
        self,
        kernel: Any,
        grid: Sequence[int],
        args: Sequence[Any],
        operands: Sequence[Operand],
        then: PreparedLaunch | None = None,
        **kwargs: Any,
    ) -> None:
        self.kernel, self.grid = kernel, tuple(int(g) for g in grid)
        self.args, self.kwargs = list(args), dict(kwargs)
        self.operands, self.then = tuple(operands), then
        self.empty = any(g == 0 for g in self.grid)
        self.full_launches = self.bound_launches = 0
        self._bound: tuple[Any, ...] | None = None  # (compiled kernel, argument list, pointer plan, device)

    def __call__(self, *inputs: Any) -> None:
        """Launch with these inputs (one per operand)."""
        if not self.empty and (self._bound is None or not self._launch_bound(inputs)):
            self._launch_full(inputs)
        if self.then is not None:
            self.then(*inputs)

    def _launch_full(self, inputs: Sequence[Any]) -> None:
        args = list(self.args)
        for op, value in zip(self.operands, inputs):
            for i in op.indices:
                args[i] = value if op.scalar or op.view is None else op.view(value)
        compiled = self.kernel[self.grid](*args, **self.kwargs)
        self.full_launches += 1
        if self._bound is None and _bindable() and hasattr(compiled, "packed_metadata"):
            self._bind(compiled, args, inputs)

    def _bind(self, compiled: Any, args: list[Any], inputs: Sequence[Any]) -> None:
        """Store the compiled kernel's full argument list (the kernel's parameters in order, defaults
        filled in, fixed tensors as their addresses) and, per tensor operand, its view's byte offset
        into the input and its alignment."""
        values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]  # self.args keeps them
        for name, default in _parameters(self.kernel)[len(args) :]:
            values.append(self.kwargs.get(name, default))
        pointers = []  # (input position, argument indices, byte offset, 16-byte aligned)
        scalars = []  # (input position, argument indices)
        for pos, (op, value) in enumerate(zip(self.operands, inputs)):
            if op.indices and op.scalar:
                scalars.append((pos, op.indices))
            elif op.indices:
                ptr = args[op.indices[0]].data_ptr()
                pointers.append((pos, op.indices, ptr - value.data_ptr(), ptr % 16 == 0))
        device = inputs[pointers[0][0]].device.index if pointers else None
        self._bound = (compiled, values, tuple(pointers), tuple(scalars), device)

    def _launch_bound(self, inputs: Sequence[Any]) -> bool:
        """Launch the compiled kernel directly; False (nothing launched) where a pointer's alignment
        differs from the one the kernel was compiled for, or a launch hook (a profiler's) is set: the
        JITFunction then launches, and calls the hooks."""
        compiled, values, pointers, scalars, device = self._bound
        knobs = triton.knobs.runtime
        if _hooked(knobs.launch_enter_hook) or _hooked(knobs.launch_exit_hook):
            return False
        for pos, indices, offset, aligned in pointers:
            ptr = inputs[pos].data_ptr() + offset
            if (ptr % 16 == 0) != aligned:
                return False
            for i in indices:
                values[i] = ptr
        for pos, indices in scalars:
            for i in indices:
                values[i] = inputs[pos]
        grid = self.grid
        compiled.run(
            grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            triton.runtime.driver.active.get_current_stream(device), compiled.function,
            compiled.packed_metadata, None, None, None, *values,
        )  # fmt: skip
        self.bound_launches += 1
        return True
