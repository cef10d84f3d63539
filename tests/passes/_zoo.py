"""Tiny random-weight encoders of common architectures beyond BERT/RoBERTa/ViT/GPT-2, built from a
transformers Config (no download): each `ZOO[name]()` returns (module, example_inputs, dynamic axes)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

V = 128
LAYERS = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
TEXT = dict(hidden_size=32, vocab_size=V, max_position_embeddings=66, **LAYERS)
SEQ2SEQ = {
    "vocab_size": V,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
}


def _text_inputs() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[-1, 4:] = 0
    return {"input_ids": torch.randint(3, V, (2, 8), generator=g), "attention_mask": mask}


def _wrap(model: Any, kind: str) -> Any:
    """The model's first output from (input_ids, attention_mask) or from one tensor named `kind`."""
    import torch

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model.eval()

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model.eval()

        def forward(self, x):
            return self.m(**{kind: x})[0]

    return Text() if kind == "text" else One()


def _text(build: Callable[[Any], Any]) -> Callable[[], tuple]:
    def make() -> tuple:
        import torch
        import transformers as T

        torch.manual_seed(0)
        return _wrap(build(T), "text"), _text_inputs(), "batch,seq"

    return make


def _image(build: Callable[[Any], Any]) -> Callable[[], tuple]:
    def make() -> tuple:
        import torch
        import transformers as T

        torch.manual_seed(0)
        model = build(T)
        return _wrap(model, "pixel_values"), (torch.randn(2, 3, 32, 32),), "batch"

    return make


def _audio() -> tuple:
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.Wav2Vec2Config(
        hidden_size=32,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        **LAYERS,
    )
    return _wrap(T.Wav2Vec2Model(cfg), "input_values"), (torch.randn(2, 400),), "batch,seq"


def _ast() -> tuple:
    """Audio Spectrogram Transformer: a ViT over [batch, frames, mel bins]."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.ASTConfig(
        num_mel_bins=16,
        max_length=32,
        patch_size=8,
        frequency_stride=8,
        time_stride=8,
        hidden_size=32,
        **LAYERS,
    )
    return _wrap(T.ASTModel(cfg), "input_values"), (torch.randn(2, 32, 16),), "batch"


def _whisper() -> tuple:
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.WhisperConfig(num_mel_bins=16, max_source_positions=32, max_target_positions=32, **SEQ2SEQ)
    return _wrap(T.WhisperModel(cfg).get_encoder(), "input_features"), (torch.randn(2, 16, 64),), "batch"


def _sentence_embedding() -> tuple:
    """BERT + masked mean pooling + L2 normalisation, as sentence-transformers models run."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    bert = T.BertModel(T.BertConfig(**TEXT), add_pooling_layer=False).eval()

    class MeanPool(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = bert

        def forward(self, input_ids, attention_mask):
            h = self.m(input_ids=input_ids, attention_mask=attention_mask)[0]
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            return torch.nn.functional.normalize((h * w).sum(1) / w.sum(1).clamp(min=1e-9), dim=-1)

    return MeanPool(), _text_inputs(), "batch,seq"


def _mistral_sliding_window() -> tuple:
    """A decoder as a feature extractor, ids only: its mask is causal AND a sliding window of 4."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.MistralConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        sliding_window=4,
        use_cache=False,
    )
    return _wrap(T.MistralModel(cfg), "input_ids"), (_text_inputs()["input_ids"],), "batch,seq"


VIT = dict(image_size=32, patch_size=8, hidden_size=32, **LAYERS)
ZOO: dict[str, Callable[[], tuple]] = {
    "distilbert": _text(
        lambda T: T.DistilBertModel(
            T.DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
        )
    ),
    "albert": _text(
        lambda T: T.AlbertModel(T.AlbertConfig(embedding_size=16, **TEXT), add_pooling_layer=False)
    ),
    "electra": _text(lambda T: T.ElectraModel(T.ElectraConfig(embedding_size=16, **TEXT))),
    "deberta_v2": _text(lambda T: T.DebertaV2Model(T.DebertaV2Config(**TEXT))),
    "mpnet": _text(lambda T: T.MPNetModel(T.MPNetConfig(**TEXT), add_pooling_layer=False)),
    "xlm_roberta": _text(lambda T: T.XLMRobertaModel(T.XLMRobertaConfig(**TEXT), add_pooling_layer=False)),
    "mobilebert": _text(
        lambda T: T.MobileBertModel(
            T.MobileBertConfig(
                **{**TEXT, "intermediate_size": 32},
                embedding_size=16,
                intra_bottleneck_size=16,
                true_hidden_size=16,
                num_feedforward_networks=2,
            ),
            add_pooling_layer=False,
        )
    ),
    "modernbert": _text(
        lambda T: T.ModernBertModel(
            T.ModernBertConfig(
                **TEXT,
                global_attn_every_n_layers=2,
                local_attention=8,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                cls_token_id=1,
                sep_token_id=2,
            )
        )
    ),
    "sentence_embedding": _sentence_embedding,
    "clip_text": _text(lambda T: T.CLIPTextModel(T.CLIPTextConfig(**TEXT))),
    "siglip_text": _text(lambda T: T.SiglipTextModel(T.SiglipTextConfig(**TEXT))),
    "t5_encoder": _text(
        lambda T: T.T5EncoderModel(
            T.T5Config(vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
        )
    ),
    "bart_encoder": _text(lambda T: T.BartModel(T.BartConfig(**SEQ2SEQ)).get_encoder()),
    "marian_encoder": _text(lambda T: T.MarianMTModel(T.MarianConfig(**SEQ2SEQ)).get_encoder()),
    "deit": _image(lambda T: T.DeiTModel(T.DeiTConfig(**VIT), add_pooling_layer=False)),
    "dinov2": _image(lambda T: T.Dinov2Model(T.Dinov2Config(**VIT))),
    "beit": _image(
        lambda T: T.BeitModel(T.BeitConfig(use_relative_position_bias=True, **VIT), add_pooling_layer=False)
    ),
    "clip_vision": _image(lambda T: T.CLIPVisionModel(T.CLIPVisionConfig(**VIT))),
    "siglip_vision": _image(lambda T: T.SiglipVisionModel(T.SiglipVisionConfig(**VIT))),
    "swin": _image(
        lambda T: T.SwinModel(
            T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2], num_heads=[2], window_size=4)
        )
    ),
    "segformer": _image(
        lambda T: T.SegformerModel(
            T.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                num_attention_heads=[1, 2],
                patch_sizes=[7, 3],
                strides=[4, 2],
                mlp_ratios=[2, 2],
            )
        )
    ),
    "convnext": _image(
        lambda T: T.ConvNextModel(T.ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1]))
    ),
    "resnet": _image(
        lambda T: T.ResNetModel(T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]))
    ),
    "mobilevit": _image(
        lambda T: T.MobileViTModel(
            T.MobileViTConfig(
                image_size=32,
                hidden_sizes=[16, 16, 16],
                neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
                num_attention_heads=2,
            )
        )
    ),
    "audio_spectrogram": _ast,
    "whisper_encoder": _whisper,
    "wav2vec2": _audio,
    "mistral_sliding_window": _mistral_sliding_window,
}
