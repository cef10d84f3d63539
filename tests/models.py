"""Tiny model builders shared by tests (random weights, seconds to export and build on 2 CPU cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def tiny_bert(seed: int = 0) -> Any:
    """transformers BertModel with a tiny config and random weights, in eval mode."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return BertModel(cfg).eval()


def bert_inputs(batch: int, seq: int, seed: int = 0, vocab: int = 128) -> dict[str, Any]:
    """Random token ids, a padding mask (last sequence shorter) and zero token types."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if seq > 2:
        mask[-1, seq // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def tiny_onnx(path: Path, *, dynamic_batch: bool = True) -> Path:
    """x[B,4] -> Relu(x @ W + b) as a self-contained ONNX file (opset 17)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    batch = "batch" if dynamic_batch else 2
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
            helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
            helper.make_node("Relu", ["hb"], ["y"], name="relu"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def tiny_onnx_external(directory: Path, data: str = "m.data") -> Path:
    """The tiny model (:func:`tiny_onnx`) as directory/m.onnx with every weight in directory/`data`."""
    import onnx

    source = tiny_onnx(directory / ".tiny-src.onnx")
    path = directory / "m.onnx"
    onnx.save(onnx.load(str(source)), str(path), save_as_external_data=True, location=data, size_threshold=0)
    source.unlink()
    return path


def tiny_bert_64(seed: int = 0) -> Any:
    """A tiny random BertModel that knows only 64 positions (max_position_embeddings=64)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(cfg).eval()


def bert64_factory() -> tuple[Any, dict[str, Any]]:
    """`module:factory` source for CLI tests: (tiny BERT with 64 positions, batch-2 length-8 inputs)."""
    return tiny_bert_64(), bert_inputs(2, 8)
