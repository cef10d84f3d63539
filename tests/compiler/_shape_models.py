"""Tiny ONNX graphs whose sequence axis has a limit: a position table (via Range or a sliced constant
buffer) or a constant the input must broadcast with."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _save(graph, path: Path | None):
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, str(path))
    return model


def position_table_model(
    path: Path | None = None,
    *,
    rows: int = 8,
    buffer: int | None = None,
    offset: int = 0,
    zeros: bool = False,
):
    """y[b, s, 4] = word[ids] + pos[positions + offset]: positions from Range(0, s), or from a constant
    position-id buffer of `buffer` entries sliced to s (as Hugging Face BERT exports); a non-zero
    `offset` is added as a constant (BART's learned positions start at 2). `zeros`: the buffer holds 0s, a
    token-type-id buffer (BERT's, sliced the same way into its 2-row token-type table), not positions."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "word"),
        numpy_helper.from_array(rng.standard_normal((rows, 4)).astype(np.float32), "pos_table"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
    ]
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["emb"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"]),
    ]
    if buffer is None:
        nodes.append(helper.make_node("Range", ["zero", "seq", "one"], ["positions"]))
    else:
        inits += [
            numpy_helper.from_array(
                (np.zeros if zeros else np.arange)(buffer, dtype=np.int64)[None], "position_ids"
            ),
            numpy_helper.from_array(np.array([0], np.int64), "start"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ]
        nodes += [
            helper.make_node("Unsqueeze", ["seq", "start"], ["end"]),
            helper.make_node("Slice", ["position_ids", "start", "end", "axes"], ["positions"]),
        ]
    if offset:
        inits.append(numpy_helper.from_array(np.array(offset, np.int64), "offset"))
        nodes.append(helper.make_node("Add", ["offset", "positions"], ["shifted"]))
    nodes += [
        helper.make_node("Gather", ["pos_table", "shifted" if offset else "positions"], ["pemb"]),
        helper.make_node("Add", ["emb", "pemb"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "positions",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        inits,
    )
    return _save(graph, path)


def broadcast_model(path: Path | None = None, width: int = 64):
    """y[b, s] = x[b, s] + c[1, width]: runs only for s == width (or 1); nothing in the graph says so
    statically, so only running it finds the limit."""
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.ones((1, width), np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "broadcast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [c],
    )
    return _save(graph, path)


def counted_positions_model(path: Path) -> Path:
    """RoBERTa's positions: cumsum(input_ids != 1) * (input_ids != 1) + 1, masked by attention_mask,
    then Gather from a table of 12 rows (10 usable); input_ids also index a 50-token vocabulary."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.ones((12, 4), np.float32), "P"),
        numpy_helper.from_array(np.ones((50, 4), np.float32), "E"),
        numpy_helper.from_array(np.array(1, np.int64), "pad"),
        numpy_helper.from_array(np.array(1, np.int64), "axis"),
    ]
    nodes = [
        helper.make_node("Equal", ["input_ids", "pad"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["real"]),
        helper.make_node("Cast", ["real"], ["real_i"], to=TensorProto.INT64),
        helper.make_node("Mul", ["real_i", "attention_mask"], ["m"]),
        helper.make_node("CumSum", ["m", "axis"], ["c"]),
        helper.make_node("Mul", ["c", "m"], ["cm"]),
        helper.make_node("Add", ["cm", "pad"], ["pos"]),
        helper.make_node("Gather", ["P", "pos"], ["p"]),
        helper.make_node("Gather", ["E", "input_ids"], ["e"]),
        helper.make_node("Add", ["e", "p"], ["y"]),
    ]
    ids = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "attention_mask")
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])]
    graph = helper.make_graph(nodes, "counted", ids, out, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path
