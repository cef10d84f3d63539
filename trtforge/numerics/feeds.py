"""Synthetic feeds from input specs, one rule set for every verifier and report.

- float inputs: standard normal;
- integer inputs that index an embedding table (a Gather over a constant, possibly through Cast /
  Reshape / Unsqueeze / ...): ids within the table's rows;
- integer or bool inputs named like a mask, rank >= 2: 1s with a random padded tail of 0s per row
  (every row keeps at least one real position);
- other integer or bool inputs: random 0/1.

Symbolic dims get concrete sizes by `model_feeds`: each distinct dim name takes the next size from
`sizes` in order of first appearance (so two axes that must match do, and different axes differ).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

Feed = dict[str, np.ndarray]
Dim = int | str | None  # static size, symbolic name, or unknown
# Ops an index tensor may pass through on its way to the embedding Gather.
INDEX_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"})
DEFAULT_SIZES = (2, 7, 5, 3, 6)
# Largest sample array generated for an ONNX Runtime check (inputs declared larger are refused).
MAX_FEED_BYTES = 1 << 30


@dataclass(frozen=True)
class InputDesc:
    """One graph input as a feed maker needs it: name, numpy dtype, dims and embedding rows (if any)."""

    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...]
    vocab: int | None = None


def embedding_rows(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> rows of the constant table it indexes through a Gather (see the module doc)."""
    tables = {i.name: list(i.dims) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            tables[n.output[0]] = list(n.attribute[0].t.dims)
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    found: dict[str, int] = {}
    for vi in model.graph.input:
        frontier, seen = [vi.name], set()
        while frontier and vi.name not in found:
            cur = frontier.pop()
            seen.add(cur)
            for n in consumers.get(cur, []):
                if n.op_type in ("Gather", "GatherElements") and len(n.input) > 1 and n.input[1] == cur:
                    dims = tables.get(n.input[0])
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    if dims and -len(dims) <= axis < len(dims):
                        found[vi.name] = int(dims[axis])
                        break
                elif n.op_type in INDEX_PASSTHROUGH and n.input and n.input[0] == cur:
                    frontier.extend(o for o in n.output if o and o not in seen)
    return found


def describe_inputs(model: onnx.ModelProto) -> list[InputDesc]:
    """The model's non-initializer inputs with dtype, dims and embedding rows (0 elem type -> float32)."""
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    vocab = embedding_rows(model)
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims: list[Dim] = [
            int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        ]
        dtype = (
            np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype("float32")
        )
        out.append(InputDesc(vi.name, dtype, tuple(dims), vocab.get(vi.name)))
    return out


# ml_dtypes' floating types (numpy kind 'V'): bfloat16, the FP8 and FP4 formats.
ML_FLOATS = ("bfloat16", "float8", "float4")
# Manifest names whose ml_dtypes type is spelled differently.
_ML_DTYPE_NAMES = {"float4_e2m1": "float4_e2m1fn"}


def numpy_dtype_of(name: str, what: str = "tensor") -> np.dtype:
    """The NumPy dtype of a dtype name, with ml_dtypes' types for bfloat16, FP8, INT4 and FP4 (the names
    manifests use); UserError naming `what` for a name neither knows."""
    import ml_dtypes

    from trtforge.errors import UserError

    try:
        return np.dtype(name)
    except TypeError:
        pass
    found = getattr(ml_dtypes, _ML_DTYPE_NAMES.get(name, name), None)
    if found is None:
        raise UserError(f"{what} has dtype {name!r}, which has no NumPy or ml_dtypes type to make data of.")
    return np.dtype(found)


def check_finite(name: str, array: np.ndarray, where: str, purpose: str) -> None:
    """UserError naming input `name` when its floating `array` holds NaN or inf: statistics or accuracy
    figures computed from such data would be NaN, or quietly wrong, with no sign of why."""
    from trtforge.errors import UserError

    a = np.asarray(array)
    if not (a.dtype.kind in "fc" or a.dtype.name.startswith(ML_FLOATS)):
        return
    bad = ~np.isfinite(a.astype(np.float32) if a.dtype.kind == "V" else a)
    if bad.any():
        first = np.argwhere(bad)[0].tolist()
        raise UserError(
            f"{where}: input '{name}' contains {int(bad.sum())} NaN/inf value(s) (first at index {first}); "
            f"{purpose} must be finite."
        )


def check_feed_size(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """UserError when one sample array of `shape` would exceed `MAX_FEED_BYTES` (a model declaring huge
    static dims): say so by input name instead of failing inside numpy or ONNX Runtime."""
    from trtforge.errors import UserError

    nbytes = int(np.prod([int(d) for d in shape], dtype=object)) * np.dtype(dtype).itemsize
    if nbytes > MAX_FEED_BYTES:
        raise UserError(
            f"input '{name}' is declared {list(shape)} ({np.dtype(dtype).name}): one sample is "
            f"{nbytes / 2**30:.3g} GiB, above the {MAX_FEED_BYTES / 2**30:g} GiB trtforge generates for ONNX "
            "Runtime checks. Declare the large dims symbolic (dynamic) in the model, give smaller --shape "
            "ranges, or turn verification off (--no-verify)."
        )


def synthetic_array(
    name: str, dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, vocab: int | None = None
) -> np.ndarray:
    """One input array by the rules in the module doc (UserError above `MAX_FEED_BYTES`)."""
    check_feed_size(name, dtype, shape)
    dt = np.dtype(dtype)
    if dt.kind in "fc" or dt.name.startswith(ML_FLOATS):
        return rng.standard_normal(shape).astype(dt)
    if vocab is not None and dt.kind in "iu":
        return rng.integers(0, max(int(vocab), 1), size=shape).astype(dt)
    if "mask" in name.lower() and len(shape) >= 2 and shape[-1] > 1:
        mask = np.ones(shape, dtype=dt)
        for idx in np.ndindex(*shape[:-1]):
            mask[idx][int(rng.integers(1, shape[-1] + 1)) :] = 0
        return mask
    return rng.integers(0, 2, size=shape).astype(dt)


def synthetic_feed(specs: Iterable[tuple[str, np.dtype, tuple[int, ...], int | None]], seed: int = 0) -> Feed:
    """A deterministic feed from (name, dtype, concrete shape, vocab) tuples, in order."""
    rng = np.random.default_rng(seed)
    return {
        name: synthetic_array(name, dtype, tuple(shape), rng, vocab) for name, dtype, shape, vocab in specs
    }


def concrete_shapes(
    inputs: Sequence[InputDesc],
    sizes: Sequence[int] = DEFAULT_SIZES,
    max_sizes: Mapping[str, Mapping[int, int]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes: static dims kept (0 included), each distinct symbolic name the next of `sizes`; an
    unnamed or negative dim takes sizes[0] on axis 0 (the batch) and sizes[1] elsewhere. `max_sizes`
    (input -> axis -> largest size the model takes, e.g. its position table) caps a dynamic dim, and
    every axis sharing its name."""
    caps: dict[str, int] = {}
    for desc in inputs:
        for axis, d in enumerate(desc.dims):
            cap = (max_sizes or {}).get(desc.name, {}).get(axis)
            if isinstance(d, str) and cap is not None:
                caps[d] = min(caps.get(d, cap), cap)
    named: dict[str, int] = {}
    out = {}
    for desc in inputs:
        shape = []
        for axis, d in enumerate(desc.dims):
            cap = (max_sizes or {}).get(desc.name, {}).get(axis)
            if isinstance(d, int) and d >= 0:  # a static 0 is an empty axis (ONNX Runtime holds to it)
                shape.append(d)
            elif isinstance(d, str):
                shape.append(named.setdefault(d, min(sizes[len(named) % len(sizes)], caps.get(d, 1 << 62))))
            else:
                size = sizes[0] if axis == 0 else sizes[1 % len(sizes)]
                shape.append(min(size, cap) if cap is not None else size)
        out[desc.name] = tuple(shape)
    return out


def model_feed(
    model: onnx.ModelProto,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    seed: int = 0,
    max_sizes: Mapping[str, Mapping[int, int]] | None = None,
) -> Feed:
    """One deterministic feed for the model's inputs (dims sized by `concrete_shapes`, capped by
    `max_sizes`)."""
    inputs = describe_inputs(model)
    shapes = concrete_shapes(inputs, sizes, max_sizes)
    return synthetic_feed(((d.name, d.dtype, shapes[d.name], d.vocab) for d in inputs), seed)
