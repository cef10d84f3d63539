"""StableLM and SmolLM3: the pieces that set them apart from Llama (StableLM's per-head q/k LayerNorm,
SmolLM3's NoPE layers) checked against transformers' own modules, and both kept off the Llama-only paths
(fused layers, quantization, tensor parallelism). Their logits against transformers: test_generate.py,
test_torch_executor.py and test_windows.py."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.llm.models.families import adapter_for
from trtforge.llm.models.stablelm import per_head_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stablelm_per_head_norm_is_transformers_on_the_adapter_layout(dtype):
    """HF normalizes [B, heads, S, D] head by head; the adapters lay heads out [..., heads, D]."""
    attn = tiny_model("stablelm").to(dtype).model.layers[0].self_attn
    x = torch.randn(2, 5, 2, 16, dtype=dtype)  # [B, S, kv heads, D]
    want = attn.k_layernorm(x.transpose(1, 2)).transpose(1, 2)
    assert torch.equal(per_head_norm(attn.k_layernorm, x), want)


def test_smollm3_rotates_only_its_rope_layers():
    """no_rope_layers 0 marks a NoPE layer: q and k pass it unrotated, the others rotate."""
    model = tiny_model("smollm3", num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0])
    adapter = adapter_for(model)
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    rope = tuple(t[:, None] for t in adapter.rotary(torch.arange(1, 4), q.dtype))
    for i, rotated in enumerate([True, False, True, False]):
        rq, rk = adapter.rotate(i, q, k, rope)
        assert torch.equal(rq, q) is not rotated and torch.equal(rk, k) is not rotated, i
