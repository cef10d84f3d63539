"""Known input limits: from a Hugging Face config and from the ONNX graph, each with its source."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from tests.compiler._shape_models import broadcast_model, counted_positions_model, position_table_model
from trtforge.core.shape_limits import graph_limits, module_limits, source_limits
from trtforge.core.shapes import AxisLimit


def _graph(*inputs: tuple[str, int, list]):
    """A graph with just these inputs (name, ONNX type, dims): module limits only read its inputs."""
    vis = [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs]
    return helper.make_model(helper.make_graph([], "g", vis, []))


TOKENS = (
    ("input_ids", TensorProto.INT64, ["batch", "seq"]),
    ("attention_mask", TensorProto.INT64, ["batch", "seq"]),
)


def test_position_table_behind_range() -> None:
    limits = graph_limits(position_table_model(rows=8))
    assert limits == {"input_ids": {1: AxisLimit(1, 8, "the graph's position table 'pos_table' (8 rows)")}}


def test_sliced_position_buffer_shorter_than_table() -> None:
    assert graph_limits(position_table_model(rows=8, buffer=6))["input_ids"][1].hi == 6


def test_token_lookup_and_plain_graphs_have_no_graph_limit() -> None:
    """The vocabulary table is indexed by the input itself: no sequence limit; nor from a broadcast."""
    assert graph_limits(broadcast_model()) == {}
    model = position_table_model(rows=8)
    kept = [n for n in model.graph.node if n.output[0] in ("emb",)]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    assert graph_limits(model) == {}


def test_bert_config_positions() -> None:
    from tests.models import tiny_bert_64

    limits = module_limits(tiny_bert_64(), _graph(*TOKENS))
    assert set(limits) == {"input_ids", "attention_mask"}
    lim = limits["input_ids"][1]
    assert (lim.lo, lim.hi) == (1, 64) and "config.max_position_embeddings = 64 of BertModel" in lim.source


def test_roberta_positions_lose_the_padding_offset() -> None:
    """RoBERTa numbers positions from padding_idx + 1, so 66 table rows hold 64 tokens."""
    import torch
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    cfg = RobertaConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=66,
        pad_token_id=1,
    )
    lim = module_limits(RobertaModel(cfg), _graph(*TOKENS))["input_ids"][1]
    assert lim.hi == 64 and "padding offset 2" in lim.source


def test_image_size_fixes_spatial_axes() -> None:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    graph = _graph(("pixel_values", TensorProto.FLOAT, ["batch", 3, "h", "w"]))
    limits = module_limits(ViTModel(cfg), graph)
    assert {a: (lim.lo, lim.hi) for a, lim in limits["pixel_values"].items()} == {2: (32, 32), 3: (32, 32)}


def test_source_limits_intersect_config_and_graph(tmp_path) -> None:
    from tests.models import tiny_bert_64

    path = tmp_path / "p.onnx"
    position_table_model(path, rows=32)
    both = source_limits(path, tiny_bert_64())
    assert both["input_ids"][1].hi == 32 and "pos_table" in both["input_ids"][1].source


def test_constant_position_offset_uses_up_table_rows() -> None:
    """BART-style positions (Range + 2) index a 10-row table: 8 tokens fit, and ONNX Runtime agrees."""
    import numpy as np

    from trtforge.numerics.sessions import exact_session

    model = position_table_model(rows=10, offset=2)
    lim = graph_limits(model)["input_ids"][1]
    assert (lim.lo, lim.hi) == (1, 8) and "(10 rows, 8 usable)" in lim.source
    sess = exact_session(model)
    sess.run(None, {"input_ids": np.zeros((1, 8), np.int64)})
    with pytest.raises(Exception, match="indices"):  # ONNX Runtime's own error type
        sess.run(None, {"input_ids": np.zeros((1, 9), np.int64)})


def test_offset_on_a_sliced_buffer_counts_too() -> None:
    assert graph_limits(position_table_model(rows=10, buffer=9, offset=2))["input_ids"][1].hi == 7


def _wrap(*models):
    """A module holding Hugging Face models without a config of its own, as users wrap them to export."""
    import torch

    wrapper = torch.nn.Module()
    wrapper.inner = torch.nn.ModuleList(models)
    return wrapper


def test_config_of_a_wrapped_model_is_found() -> None:
    from tests.models import tiny_bert_64

    lim = module_limits(_wrap(tiny_bert_64()), _graph(*TOKENS))["input_ids"][1]
    assert lim.hi == 64 and "of BertModel" in lim.source


def test_two_wrapped_models_give_no_config_limit() -> None:
    """Which config bounds which input is unknown: no module limit (the graph's still apply)."""
    from tests.models import tiny_bert_64

    assert module_limits(_wrap(tiny_bert_64(), tiny_bert_64()), _graph(*TOKENS)) == {}


def test_counted_positions_of_an_exported_roberta_bound_the_sequence(tmp_path) -> None:
    """RoBERTa-family ONNX (XLM-R, CamemBERT, Data2Vec-text) count positions with CumSum over the real
    tokens, then add the padding index: 12 rows hold 10 tokens. Before: no limit was found, so compile
    derived seq 1..512 for a model that takes 10."""
    import onnx

    limits = graph_limits(onnx.load(str(counted_positions_model(tmp_path / "counted.onnx"))))
    assert limits["input_ids"][1].hi == 10 and limits["attention_mask"][1].hi == 10
    assert "(12 rows, 10 usable)" in limits["input_ids"][1].source


def test_a_sliced_buffer_of_token_type_ids_is_not_a_position_table() -> None:
    """BERT-family exports slice a buffer of 0s (token type ids) into the 2-row token-type table just as
    they slice position ids. Before: it was taken for a position table, and ConvBERT's sequence was
    limited to 2 tokens (compile derived input_ids 1x1:8x2:32x2)."""
    assert graph_limits(position_table_model(rows=2, buffer=6, zeros=True)) == {}


def test_image_size_of_a_model_without_a_position_table_fixes_nothing() -> None:
    """Before: ConvNeXt's config.image_size (224 by default) fixed its spatial axes, "its position
    embeddings fix the image size" though it has none: `compile --dynamic batch,,height,width` of a
    ConvNeXt exported at 64x64 derived 224x224 only (the size it was exported at outside the profile),
    and --shape with any other size was refused."""
    from transformers import ConvNextConfig, ConvNextModel

    graph = _graph(("pixel_values", TensorProto.FLOAT, ["batch", 3, "h", "w"]))
    model = ConvNextModel(ConvNextConfig(hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1]))
    assert model.config.image_size == 224
    assert module_limits(model, graph) == {}
