"""ONE tensor spec and ONE reader of an ONNX graph's inputs, for every wing (profiles, calibration data,
synthetic feeds, reports, the manifest and the runtime).

A dimension is an ``int``: its size when static (0 included), ``DYNAMIC`` (-1) when not. Why -1 and not a
name or None: it is what TensorRT reports for an engine's I/O, what the manifest has always written
(existing manifests load unchanged, no conversion at the boundary) and what the runtime compares against
on its hot path; a name is extra knowledge, not another spelling, so it rides beside the shape in
``symbols`` (axis -> the ONNX ``dim_param``, None when the model leaves the dim unnamed), where profiles and
feeds read which axes must match. Dtypes are NumPy/ml_dtypes names ("float32", "int64", "bfloat16"), as
in the manifest; ``np_dtype`` resolves one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtforge.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import onnx

DYNAMIC = -1
# ml_dtypes' floating types (numpy kind 'V'): bfloat16, the FP8 and FP4 formats.
ML_FLOATS = ("bfloat16", "float8", "float4")
# Manifest names whose ml_dtypes type is spelled differently.
_ML_DTYPE_NAMES = {"float4_e2m1": "float4_e2m1fn"}


@dataclass
class TensorSpec:
    """One tensor (a graph or engine input/output): name, dtype name, dims (-1 = dynamic), dim names."""

    name: str
    dtype: str
    shape: Sequence[int]
    symbols: tuple[str | None, ...] = ()
    rank_known: bool = field(default=True, compare=False)  # False: an ONNX input with no shape recorded

    def symbol(self, axis: int) -> str | None:
        """The name of dynamic axis `axis` (None when static or unnamed)."""
        if axis < len(self.symbols) and is_dynamic(self.shape[axis]):
            return self.symbols[axis]
        return None

    @property
    def is_dynamic(self) -> bool:
        """True when some dimension is dynamic."""
        return any(is_dynamic(d) for d in self.shape)

    @property
    def np_dtype(self) -> np.dtype:
        """The NumPy dtype of `dtype` (ml_dtypes' types for bfloat16, FP8, INT4, FP4)."""
        return numpy_dtype_of(self.dtype, f"tensor '{self.name}'")

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON form: name, dtype, shape (-1 for dynamic dims)."""
        return {"name": self.name, "dtype": self.dtype, "shape": [int(d) for d in self.shape]}


def is_dynamic(dim: int) -> bool:
    """True for a dynamic dimension (any negative size; -1 is the one trtforge writes)."""
    return dim < 0


def shape_mismatch(expected: Sequence[int], dims: Sequence[int]) -> int | None:
    """Where concrete `dims` stop fitting `expected` (-1 = dynamic): None when they fit, -1 for a rank
    that differs, else the first axis whose static size differs. One rule for `--shape` and for feeds."""
    if len(dims) != len(expected):
        return -1
    return next((a for a, (d, want) in enumerate(zip(dims, expected)) if want >= 0 and d != want), None)


def numpy_dtype_of(name: str, what: str = "tensor") -> np.dtype:
    """The NumPy dtype of a dtype name, with ml_dtypes' types for bfloat16, FP8, INT4 and FP4 (the names
    manifests use); UserError naming `what` for a name neither knows."""
    import numpy as np

    try:
        return np.dtype(name)
    except TypeError:
        pass
    import ml_dtypes

    found = getattr(ml_dtypes, _ML_DTYPE_NAMES.get(name, name), None)
    if found is None:
        raise UserError(f"{what} has dtype {name!r}, which has no NumPy or ml_dtypes type to make data of.")
    return np.dtype(found)


def graph_inputs(model: onnx.ModelProto | str | os.PathLike[str]) -> list[TensorSpec]:
    """The inputs of an ONNX model (or file) that the caller feeds: initializers listed as graph inputs
    (old exporters did that) are weights, not inputs, and are left out.

    A dim with a ``dim_value`` is static (0 is an empty axis); a ``dim_param`` is dynamic and named; a
    dim with neither is dynamic and unnamed. An undefined element type reads as float32. UserError
    for an input that is not a tensor (sequence, map, optional): nothing downstream can feed it. A tensor
    whose shape is not recorded at all gets an empty ``shape`` and ``rank_known=False``.
    """
    import onnx

    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.type.WhichOneof("value") not in (None, "tensor_type"):
            raise UserError(
                f"model input '{vi.name}' is a {vi.type.WhichOneof('value').removesuffix('_type')}, not a "
                "tensor; trtforge compiles, calibrates and feeds tensor inputs only. Export the model with "
                "tensor inputs."
            )
        out.append(value_spec(vi))
    return out


def graph_outputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The outputs of an ONNX model, by :func:`value_spec`'s rules (their axis names included)."""
    return [value_spec(vo) for vo in model.graph.output]


def drop_initializer_inputs(model: onnx.ModelProto) -> list[str]:
    """Remove, in place, the graph inputs that name an initializer (weights by :func:`graph_inputs`' rule,
    as TensorRT's parser takes them too); returns their names. A pass that replaces such a weight (calibrate's
    SmoothQuant) otherwise leaves an input with no default that nothing feeds."""
    inits = {i.name for i in model.graph.initializer}
    dropped = [vi.name for vi in model.graph.input if vi.name in inits]
    if dropped:
        keep = [vi for vi in model.graph.input if vi.name not in inits]
        del model.graph.input[:]
        model.graph.input.extend(keep)
    return dropped


def value_spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    """The TensorSpec of one tensor-typed ONNX value (a graph input or output), by `graph_inputs`' rules."""
    from onnx import helper

    tt = vi.type.tensor_type
    dims = tt.shape.dim
    shape = tuple(int(d.dim_value) if d.HasField("dim_value") else DYNAMIC for d in dims)
    dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "float32"
    symbols = tuple(d.dim_param or None for d in dims)
    return TensorSpec(vi.name, dtype, shape, symbols, rank_known=tt.HasField("shape"))


__all__ = [
    "DYNAMIC",
    "ML_FLOATS",
    "TensorSpec",
    "graph_inputs",
    "is_dynamic",
    "numpy_dtype_of",
    "shape_mismatch",
    "value_spec",
]
