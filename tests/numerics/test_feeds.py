"""Synthetic feeds: one rule set (ids within the vocabulary, padded masks, normal floats) for everyone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.core.tensor_spec import TensorSpec
from trtforge.numerics.feeds import embedding_rows, model_feed, synthetic_feed


def _token_model(vocab: int = 37):
    table = np.zeros((vocab, 4), np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
            helper.make_node("Gather", ["table", "ids32"], ["emb"]),
            helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "ax"], ["m3"]),
            helper.make_node("Mul", ["emb", "m3"], ["y0"]),
            helper.make_node("Add", ["y0", "extra"], ["y"]),
        ],
        "tok",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["batch", "other", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([-1], np.int64), "ax")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_vocab_found_through_casts_and_feed_follows_the_rules():
    m = _token_model()
    assert embedding_rows(m) == {"input_ids": 37}
    rows = embedding_rows(m)
    assert [rows.get(i.name) for i in m.graph.input] == [37, None, None]
    feed = model_feed(m, sizes=(3, 50, 5))
    ids, mask, extra = feed["input_ids"], feed["attention_mask"], feed["extra"]
    assert ids.shape == mask.shape == (3, 50) and extra.shape == (3, 5, 4)  # same dim name, same size
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 37 and len(np.unique(ids)) > 10
    assert set(np.unique(mask)) <= {0, 1} and (mask[:, 0] == 1).all()
    assert all((np.diff(row) <= 0).all() for row in mask), "padding is a tail of zeros"
    assert extra.dtype == np.float32 and abs(float(extra.std()) - 1) < 0.3


def test_feeds_are_deterministic_by_seed():
    m = _token_model()
    a, b, c = model_feed(m, seed=3), model_feed(m, seed=3), model_feed(m, seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["extra"], c["extra"])


def test_bool_mask_and_plain_integers():
    f = synthetic_feed(
        [("key_padding_mask", np.dtype(bool), (4, 9), None), ("flags", np.dtype(np.int32), (6,), None)]
    )
    assert f["key_padding_mask"].dtype == bool and f["key_padding_mask"][:, 0].all()
    assert f["flags"].dtype == np.int32 and set(np.unique(f["flags"])) <= {0, 1}


@pytest.mark.parametrize(
    "name", ["float32", "int64", "bool", "bfloat16", "float8_e4m3fn", "int4", "float4_e2m1"]
)
def test_every_manifest_dtype_has_a_numpy_dtype(name):
    """Manifest names for bfloat16/FP8/INT4/FP4 resolve through ml_dtypes, so reports can make data."""
    from trtforge.core.backend import MANIFEST_DTYPES
    from trtforge.core.tensor_spec import numpy_dtype_of

    assert name in MANIFEST_DTYPES
    dt = numpy_dtype_of(name)
    assert np.zeros(2, dt).dtype == dt and dt.itemsize >= 1


def test_unknown_dtype_name_is_a_user_error_naming_the_tensor():
    from trtforge.core.tensor_spec import numpy_dtype_of
    from trtforge.errors import UserError

    with pytest.raises(UserError, match=r"engine input 'x' has dtype 'quux'"):
        numpy_dtype_of("quux", "engine input 'x'")


def test_a_static_zero_dim_stays_zero():
    """ONNX Runtime holds a graph to a static 0 (an empty axis): feeds must too, not replace it by 2."""
    from trtforge.numerics.feeds import concrete_shapes

    shapes = concrete_shapes(
        [TensorSpec("x", "float32", (0, 4)), TensorSpec("y", "int64", (-1, -1), (None, "s"))]
    )
    assert shapes == {"x": (0, 4), "y": (2, 2)}


def test_max_sizes_cap_a_named_dim_on_every_axis_that_shares_it():
    """A 16-position model gets no 40-token feed, and the mask sharing the name `s` follows."""
    from trtforge.numerics.feeds import concrete_shapes

    descs = [
        TensorSpec("ids", "int64", (-1, -1), ("b", "s")),
        TensorSpec("mask", "int64", (-1, -1), ("b", "s")),
        TensorSpec("x", "float32", (-1, -1)),
    ]
    shapes = concrete_shapes(descs, (1, 40), max_sizes={"ids": {1: 16}, "x": {1: 3}})
    assert shapes == {"ids": (1, 16), "mask": (1, 16), "x": (1, 3)}
    assert concrete_shapes(descs, (1, 40)) == {"ids": (1, 40), "mask": (1, 40), "x": (1, 40)}
