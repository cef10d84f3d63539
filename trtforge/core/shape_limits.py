"""Known limits of a model's input axes, so derived profiles (and report inputs) stay runnable.

Two sources, each recorded with the limit:
- a torch module's Hugging Face `config`: `max_position_embeddings` (or `n_positions`, `max_seq_len`,
  ...) bounds the sequence axis (less the padding offset of RoBERTa-style position ids), and
  `image_size` fixes the spatial axes of image inputs of a model with an absolute position table;
- the ONNX graph: a position-embedding table (a `Gather` on a 2-D initializer whose indices come from a
  `Range`, a slice of a constant position-id buffer, or a `CumSum` count of the real tokens times the
  mask as RoBERTa's are, not from a graph input) bounds the sequence axis by its row count (less any
  constant added to the positions), and by the length of the sliced buffer.

The sequence axis is axis 1 of a rank-2 or rank-3 input whose axis 1 is dynamic; spatial axes are
2 and 3 of a rank-4 input. Limits found nowhere stay unknown: the ONNX Runtime shape check
(`compiler.shape_check`) then catches a range the model cannot take.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trtforge.core.shapes import AxisLimit, tighter_limit
from trtforge.core.tensor_spec import graph_inputs, is_dynamic

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx")
# Ops an index tensor may pass through on its way from a graph input to an embedding Gather.
_INDEX_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
# onnx.TensorProto integer element types: UINT8, INT8, UINT16, INT16, INT32, INT64, UINT32, UINT64.
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})
# Ops between a position source (Range, sliced constant) and the position-table Gather.
_POSITION_PATH = frozenset(
    {
        "Cast",
        "Reshape",
        "Unsqueeze",
        "Squeeze",
        "Flatten",
        "Identity",
        "Expand",
        "Add",
        "Slice",
        "Range",
        "CumSum",
        "Mul",
    }
)


def _axes(model: Any) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(sequence axes, spatial axes) of the graph's inputs (`graph_inputs`)."""
    seq, spatial = [], []
    for t in graph_inputs(model):
        if len(t.shape) in (2, 3) and is_dynamic(t.shape[1]):
            seq.append((t.name, 1))
        if len(t.shape) == 4:
            spatial += [(t.name, a) for a in (2, 3) if is_dynamic(t.shape[a])]
    return seq, spatial


def _config_value(config: Any, keys: tuple[str, ...]) -> tuple[str, int] | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return key, value
    return None


def _padding_offset(module: Any) -> int:
    """RoBERTa-style position ids start after the padding index: the table's first rows are unused."""
    emb = getattr(getattr(module, "embeddings", None), "position_embeddings", None)
    pad = getattr(emb, "padding_idx", None)
    return int(pad) + 1 if isinstance(pad, int) and pad >= 0 else 0


def _config_owner(module: Any) -> Any:
    """The module holding the Hugging Face config: `module` itself, or the one outermost submodule with
    a config when `module` wraps a model (a wrapper picking outputs); None when none or several do."""
    if getattr(module, "config", None) is not None:
        return module
    named = getattr(module, "named_modules", None)
    if named is None:
        return None
    owners = {name: m for name, m in named() if getattr(m, "config", None) is not None}
    outermost = [m for name, m in owners.items() if not any(name.startswith(f"{o}.") for o in owners)]
    return outermost[0] if len(outermost) == 1 else None


def _has_position_table(module: Any) -> bool:
    """Whether `module` holds a learned absolute position table (ViT's `position_embeddings`, CLIP's
    `position_embedding`), the thing that ties a vision model to `config.image_size`. Convolutional and
    windowed models carry `image_size` in their configs too (ConvNeXt: 224) yet take any size."""
    named = getattr(module, "named_parameters", None)
    if named is None:
        return False
    names = [name for name, _ in (*named(), *module.named_buffers())]
    return any(part.startswith("position_embedding") for name in names for part in name.split("."))


def module_limits(module: Any, model: Any) -> dict[str, dict[int, AxisLimit]]:
    """Limits from a torch module's Hugging Face config (or that of the one model it wraps), applied to
    the axes of exported graph `model`."""
    module = _config_owner(module)
    if module is None:
        return {}
    config = module.config
    seq_axes, spatial_axes = _axes(model)
    out: dict[str, dict[int, AxisLimit]] = {}
    kind = type(module).__name__
    found = _config_value(config, _POSITION_KEYS)
    if found is not None and seq_axes:
        key, value = found
        offset = _padding_offset(module)
        source = f"config.{key} = {value} of {kind}"
        if offset:
            source += f", less the padding offset {offset} of its position ids"
        for name, axis in seq_axes:
            out.setdefault(name, {})[axis] = AxisLimit(1, value - offset, source)
    size = getattr(config, "image_size", None) if _has_position_table(module) else None
    if isinstance(size, (list, tuple)) and len(size) == 2:
        sizes = [int(size[0]), int(size[1])]
    elif isinstance(size, int) and size > 0:
        sizes = [size, size]
    else:
        sizes = []
    for name, axis in spatial_axes if sizes else []:
        value = sizes[axis - 2]
        source = f"config.image_size = {size} of {kind} (its position embeddings fix the image size)"
        out.setdefault(name, {})[axis] = AxisLimit(value, value, source)
    return out


def _input_derived(model: Any) -> set[str]:
    """Tensors that are graph inputs or pass-through copies of them (token ids on their way to a table)."""
    derived = {vi.name for vi in model.graph.input}
    changed = True
    while changed:
        changed = False
        for n in model.graph.node:
            if n.op_type in _INDEX_PASSTHROUGH and n.input and n.input[0] in derived:
                new = [o for o in n.output if o not in derived]
                derived.update(new)
                changed = changed or bool(new)
    return derived


def graph_limits(model: Any) -> dict[str, dict[int, AxisLimit]]:
    """Limits read from the ONNX graph itself: position tables (see the module docstring)."""
    seq_axes, _ = _axes(model)
    if not seq_axes:
        return {}
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    constants = dict(inits)
    scalars = {i.name: _int_scalar(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                constants[n.output[0]] = list(value.dims)
                scalars[n.output[0]] = _int_scalar(value)
    producer = {o: n for n in model.graph.node for o in n.output}
    tensors = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        value = (
            next((a.t for a in n.attribute if a.name == "value"), None) if n.op_type == "Constant" else None
        )
        if value is not None:
            tensors[n.output[0]] = value
    from_inputs = _input_derived(model)
    best: AxisLimit | None = None
    for n in model.graph.node:
        if n.op_type != "Gather" or len(n.input) < 2 or n.input[1] in from_inputs:
            continue
        table = inits.get(n.input[0])
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
        if table is None or len(table) != 2 or axis != 0:
            continue
        rows = _position_rows(n.input[1], producer, constants, scalars, int(table[0]), tensors)
        if rows is not None and (best is None or rows < best.hi):
            usable = f", {rows} usable" if rows < int(table[0]) else ""
            best = AxisLimit(1, rows, f"the graph's position table '{n.input[0]}' ({table[0]} rows{usable})")
    if best is None:
        return {}
    return {name: {axis: best} for name, axis in seq_axes}


def _int_scalar(tensor: Any) -> int | None:
    """The value of a one-element integer tensor, else None."""
    import numpy as np
    from onnx import numpy_helper

    if int(np.prod(list(tensor.dims), dtype=np.int64)) != 1 or tensor.data_type not in _INT_TYPES:
        return None
    return int(numpy_helper.to_array(tensor).reshape(-1)[0])


def _counts_up(tensor: Any) -> bool:
    """True when a constant buffer holds position ids, 0, 1, 2, ... along its last axis. BERT-family
    models also slice a buffer of token type ids, all 0, into the 2-row token-type table: taken for
    positions, it limited ConvBERT's sequence to 2 tokens."""
    import numpy as np
    from onnx import numpy_helper

    if tensor is None or tensor.data_type not in _INT_TYPES:
        return False
    values = numpy_helper.to_array(tensor)
    if values.ndim == 0 or values.shape[-1] < 2:
        return False
    return bool(np.all(np.diff(values.reshape(-1, values.shape[-1]), axis=-1) > 0))


def _position_rows(
    indices: str,
    producer: Mapping[str, Any],
    constants: Mapping[str, list[int]],
    scalars: Mapping[str, int | None],
    rows: int,
    tensors: Mapping[str, Any],
) -> int | None:
    """Rows usable when `indices` come from a Range or a sliced constant buffer; None if they do not.
    A constant added on the way (BART's learned positions start at 2) or a Range's constant start uses
    up that many rows."""
    frontier, seen, is_position, offset = [(indices, 0)], set(), False, 0
    for _ in range(64):
        if not frontier:
            break
        cur, shift = frontier.pop()
        if cur in seen:
            continue
        seen.add(cur)
        node = producer.get(cur)
        if node is None or node.op_type not in _POSITION_PATH:
            continue
        if node.op_type == "Range":
            is_position = True
            offset = max(offset, shift + max(scalars.get(node.input[0]) or 0, 0))
            continue
        if node.op_type == "CumSum":  # RoBERTa's positions: 1..S counted over the real tokens
            is_position = True
            offset = max(offset, shift + 1)
            continue
        if node.op_type == "Mul":  # the count times the mask: follow what is not a constant
            frontier.extend((i, shift) for i in node.input if i and i not in constants)
            continue
        if node.op_type == "Slice" and node.input[0] in constants and _counts_up(tensors.get(node.input[0])):
            is_position = True
            offset = max(offset, shift)
            dims = constants[node.input[0]]
            if dims:
                rows = min(rows, int(dims[-1]))
            continue
        if node.op_type == "Add" and len(node.input) == 2:
            added = [scalars.get(i) for i in node.input]
            for k, value in enumerate(added):
                if value is not None and value >= 0 and added[1 - k] is None:
                    frontier.append((node.input[1 - k], shift + value))
                    break
            else:
                frontier.extend((i, shift) for i in node.input if i)
            continue
        frontier.extend((i, shift) for i in node.input[:1] if i)
        if node.op_type == "Expand":
            frontier.extend((i, shift) for i in node.input[1:2] if i)
    return max(rows - offset, 1) if is_position else None


def source_limits(model: Any, module: Any = None) -> dict[str, dict[int, AxisLimit]]:
    """All known limits of graph `model`'s inputs (an onnx.ModelProto or a path to one): the module's
    config and the graph's, intersected."""
    if isinstance(model, (str, os.PathLike)):
        import onnx

        model = onnx.load(str(model), load_external_data=False)
    out: dict[str, dict[int, AxisLimit]] = {}
    for found in (module_limits(module, model) if module is not None else {}, graph_limits(model)):
        for name, axes in found.items():
            for axis, lim in axes.items():
                out.setdefault(name, {})[axis] = tighter_limit(out.get(name, {}).get(axis), lim)
    return out
