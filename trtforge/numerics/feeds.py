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
from typing import TYPE_CHECKING

import numpy as np

from trtforge.core.tensor_spec import ML_FLOATS, TensorSpec, graph_inputs, is_dynamic

if TYPE_CHECKING:
    import onnx

Feed = dict[str, np.ndarray]
# Ops an index tensor may pass through on its way to the embedding Gather.
INDEX_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"})
DEFAULT_SIZES = (2, 7, 5, 3, 6)
# Largest sample array generated for an ONNX Runtime check (inputs declared larger are refused).
MAX_FEED_BYTES = 1 << 30


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


def check_feed_values(feed: Mapping[str, np.ndarray], rows: Mapping[str, int], where: str) -> None:
    """UserError naming the input when user data holds values the model cannot mean: ids outside the
    embedding table they index (`rows`: input -> table rows, see `embedding_rows`), or an integer
    [batch, seq] `attention_mask` with values other than 0 and 1. ONNX Runtime's Gather takes -rows..-1
    too, counting from the end, and any mask value ran as if it were 1: both gave statistics of the
    wrong inputs without a word."""
    from trtforge.errors import UserError

    for name, n in rows.items():
        ids = feed.get(name)
        if ids is None or not ids.size or ids.dtype.kind not in "iu":
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= n:
            raise UserError(
                f"{where}: input '{name}' holds the id {low if low < 0 else high}, but it indexes a table of "
                f"{n} rows (ids 0..{n - 1}). Check that the data fits the model (token ids within its "
                "vocabulary, made by the model's own tokenizer)."
            )
    mask = feed.get("attention_mask")
    if mask is None or mask.ndim != 2 or mask.dtype.kind not in "iu" or not mask.size:
        return
    odd = np.setdiff1d(np.unique(mask), [0, 1])
    if odd.size:
        raise UserError(
            f"{where}: input 'attention_mask' holds {int(odd[0])}; an attention mask holds 1 for real "
            "tokens and 0 for padding only."
        )


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
    inputs: Sequence[TensorSpec],
    sizes: Sequence[int] = DEFAULT_SIZES,
    max_sizes: Mapping[str, Mapping[int, int]] | None = None,
    given: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes: static dims kept (0 included), each distinct dim name the next of `sizes`; an
    unnamed dynamic dim takes sizes[0] on axis 0 (the batch) and sizes[1] elsewhere. `max_sizes`
    (input -> axis -> largest size the model takes, e.g. its position table) caps a dynamic dim, and
    every axis sharing its name. `given` (input -> exact shape, e.g. `--verify-shape input_ids:1x100`)
    fixes the dim names it covers for every input: an attention_mask [batch, seq] left generated then
    matches the input_ids given, where it used to get its own sizes and the model could not run."""
    caps: dict[str, int] = {}
    for desc in inputs:
        for axis in range(len(desc.shape)):
            cap = (max_sizes or {}).get(desc.name, {}).get(axis)
            sym = desc.symbol(axis)
            if sym is not None and cap is not None:
                caps[sym] = min(caps.get(sym, cap), cap)
    named: dict[str, int] = {}
    for desc in inputs:
        for axis, size in enumerate((given or {}).get(desc.name, ())):
            sym = desc.symbol(axis) if axis < len(desc.shape) else None
            if sym is not None:
                named.setdefault(sym, int(size))
    out = {}
    for desc in inputs:
        shape = []
        for axis, d in enumerate(desc.shape):
            cap = (max_sizes or {}).get(desc.name, {}).get(axis)
            sym = desc.symbol(axis)
            if not is_dynamic(d):  # a static 0 is an empty axis (ONNX Runtime holds to it)
                shape.append(int(d))
            elif sym is not None:
                shape.append(
                    named.setdefault(sym, min(sizes[len(named) % len(sizes)], caps.get(sym, 1 << 62)))
                )
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
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> Feed:
    """One deterministic feed for the model's inputs (dims sized by `concrete_shapes`, capped by
    `max_sizes`); `shapes` gives named inputs exact shapes instead (e.g. a build profile's OPT)."""
    inputs = graph_inputs(model)
    vocab = embedding_rows(model)
    given = {k: tuple(v) for k, v in (shapes or {}).items()}
    shapes = {**concrete_shapes(inputs, sizes, max_sizes, given), **given}
    return synthetic_feed(((d.name, d.np_dtype, shapes[d.name], vocab.get(d.name)) for d in inputs), seed)
