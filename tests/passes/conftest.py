"""Real torch.onnx exports of tiny transformers (random weights), cached per test session."""

from __future__ import annotations

import os
import warnings

import onnx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# kind -> (layers, expected counts per layer); every kind has 2 LayerNorms per layer + 1.
TINY = {
    "bert": {"hidden": 32, "heads": 4},
    "bert64": {"hidden": 128, "heads": 2},  # head size 64: TensorRT has attention kernels for it
    "gpt2": {"hidden": 32, "heads": 4},
    "gpt2_nomask": {"hidden": 32, "heads": 4},
    "vit": {"hidden": 32, "heads": 4},
}
LAYERS = 2


def _model(kind: str):
    import torch
    import transformers as T

    torch.manual_seed(0)
    spec = TINY[kind]
    if kind.startswith("bert"):
        cfg = T.BertConfig(
            hidden_size=spec["hidden"],
            num_hidden_layers=LAYERS,
            num_attention_heads=spec["heads"],
            intermediate_size=64,
            vocab_size=100,
            max_position_embeddings=64,
        )
        return T.BertModel(cfg).eval(), cfg
    if kind.startswith("gpt2"):
        cfg = T.GPT2Config(
            n_embd=spec["hidden"],
            n_layer=LAYERS,
            n_head=spec["heads"],
            vocab_size=100,
            n_positions=64,
            use_cache=False,
        )
        return T.GPT2Model(cfg).eval(), cfg
    cfg = T.ViTConfig(
        hidden_size=spec["hidden"],
        num_hidden_layers=LAYERS,
        num_attention_heads=spec["heads"],
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    return T.ViTModel(cfg, add_pooling_layer=False).eval(), cfg


def export_tiny(kind: str, exporter: str, path: str) -> onnx.ModelProto:
    """Export `kind` with torch.onnx.export (dynamo=True or legacy, opset 17), dynamic batch/seq."""
    import torch

    model, _cfg = _model(kind)

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]

    class Ids(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids):
            return self.m(input_ids=input_ids)[0]

    class Image(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values)[0]

    if kind == "vit":
        wrapper, args, names = Image(), (torch.randn(2, 3, 32, 32),), ["pixel_values"]
        dims = [{0: "batch"}]
    elif kind == "gpt2_nomask":
        wrapper, args, names = Ids(), (torch.randint(0, 100, (2, 8)),), ["input_ids"]
        dims = [{0: "batch", 1: "seq"}]
    else:
        ids, mask = torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long)
        wrapper, args, names = Text(), (ids, mask), ["input_ids", "attention_mask"]
        dims = [{0: "batch", 1: "seq"}] * 2
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            shapes = tuple({k: torch.export.Dim(v) for k, v in d.items()} for d in dims)
            torch.onnx.export(
                wrapper,
                args,
                path,
                input_names=names,
                output_names=["out"],
                dynamo=True,
                dynamic_shapes=shapes,
            )
        else:
            torch.onnx.export(
                wrapper,
                args,
                path,
                input_names=names,
                output_names=["out"],
                dynamo=False,
                opset_version=17,
                dynamic_axes={**dict(zip(names, dims)), "out": {0: "batch"}},
            )
    return onnx.load(path)


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """tiny_export(kind, exporter) -> onnx.ModelProto, exported once per session."""
    cache: dict[tuple[str, str], onnx.ModelProto] = {}
    root = tmp_path_factory.mktemp("exports")

    def get(kind: str, exporter: str) -> onnx.ModelProto:
        key = (kind, exporter)
        if key not in cache:
            cache[key] = export_tiny(kind, exporter, str(root / f"{kind}_{exporter}.onnx"))
        out = onnx.ModelProto()
        out.CopyFrom(cache[key])
        return out

    return get
