"""The torch executor on trtforge's Triton kernels agrees with its torch references.

On a CUDA device the kernels run for real (``-m gpu``); elsewhere the same checks run in Triton's
CPU interpreter (tests/llm/conftest.py), so the adapter and the fused layer kernels are covered in CI.
"""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.llm.paged_metadata import mixed_batch, mixed_metadata
from tests.llm.serving_models import run_to_completion, tiny_llama
from tests.llm.tiny_models import KERNEL_FAMILIES, MOE_FAMILIES
from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors.paged_attention import paged_attention_reference
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


LAYOUTS = {
    # decodes and prompt chunks interleaved, with and without a cached prefix, one crossing blocks
    "interleaved": ([37, 20, 90, 1, 130, 17], [1, 20, 33, 1, 1, 5]),
    # running sequences first (the scheduler's order): the decode rows are read and written in place
    "decodes-first": ([37, 1, 130, 20, 90], [1, 1, 1, 20, 33]),
    "decode-only": ([37, 1, 130], [1, 1, 1]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("into", [False, True], ids=["new", "out"])
def test_triton_attention_matches_the_reference_on_a_mixed_batch(device, layout, into):
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    skip_unless_runs_here(device)
    meta, k_pool, v_pool, q, d = mixed_batch(device, *LAYOUTS[layout], 0)
    out = torch.full_like(q, float("nan")) if into else None
    attention = TritonPagedAttention()
    got = attention(q, k_pool, v_pool, meta, d**-0.5, out=out)
    want = paged_attention_reference(q.double(), k_pool.double(), v_pool.double(), meta, d**-0.5)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)
    if into:
        assert got.data_ptr() == out.data_ptr()
    where = attention.plan_of(meta, q.device).decode[0]
    assert isinstance(where, slice) == (layout != "interleaved")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["interleaved", "decode-only"])
def test_triton_attention_takes_attention_chunks_on_a_mixed_batch(device, layout):
    """Llama 4's chunked layers: decode rows and prompt chunks (over cached prefixes of several chunks)
    through both kernels' chunk mode give the reference's chunked attention (and not the unchunked one)."""
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    skip_unless_runs_here(device)
    meta, k_pool, v_pool, q, d = mixed_batch(device, *LAYOUTS[layout], 2)
    got = TritonPagedAttention()(q, k_pool, v_pool, meta, d**-0.5, chunk=24)
    pools = (q.double(), k_pool.double(), v_pool.double(), meta, d**-0.5)
    want = paged_attention_reference(*pools, chunk=24)
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)
    assert (paged_attention_reference(*pools) - want).abs().max() > 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_fused_layer_kernels_match_the_eager_modules(device):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    from trtforge.kernels.fused_layer import rms_norm, rope_and_cache, silu_mul

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(1)
    t, hidden, hq, hkv, d, bs, nblocks = 7, 96, 6, 2, 16, 4, 9
    x = (torch.randn(t, hidden, generator=g) * 3).half().to(device)
    norm = LlamaRMSNorm(hidden, eps=1e-5).half().to(device)
    norm.weight.data = (torch.rand(hidden, generator=g) + 0.5).half().to(device)
    torch.testing.assert_close(rms_norm(x, norm.weight, norm.variance_epsilon), norm(x), atol=2e-3, rtol=2e-3)

    gu = (torch.randn(t, 2 * 40, generator=g) * 2).half().to(device)
    want = torch.nn.functional.silu(gu[:, :40]) * gu[:, 40:]
    torch.testing.assert_close(silu_mul(gu), want, atol=2e-3, rtol=2e-3)

    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).half().to(device)
    angles = torch.rand(t, d // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, -1).half().to(device)
    sin = torch.cat([angles.sin()] * 2, -1).half().to(device)
    slots = torch.tensor([5, 0, 33, 17, 2, 30, 11], dtype=torch.int32, device=device)
    k_pool = torch.full((nblocks, bs, hkv, d), float("nan"), dtype=torch.float16, device=device)
    v_pool = k_pool.clone()
    q = rope_and_cache(qkv, cos, sin, slots, k_pool, v_pool, hq, hkv)
    q_ref, k_ref = apply_rotary_pos_emb(
        qkv[:, : hq * d].view(t, hq, d).transpose(0, 1)[None],
        qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d).transpose(0, 1)[None],
        cos[None],
        sin[None],
    )
    torch.testing.assert_close(q, q_ref[0].transpose(0, 1), atol=2e-3, rtol=2e-3)
    flat_k, flat_v = k_pool.view(-1, hkv, d), v_pool.view(-1, hkv, d)
    torch.testing.assert_close(flat_k[slots.long()], k_ref[0].transpose(0, 1), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(flat_v[slots.long()], qkv[:, (hq + hkv) * d :].view(t, hkv, d))
    untouched = torch.ones(nblocks * bs, dtype=torch.bool, device=device)
    untouched[slots.long()] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all(), "wrote outside the slots"


@pytest.mark.parametrize("device", DEVICES)
def test_rope_and_cache_writes_q_into_a_given_buffer(device):
    """A piecewise step's static q buffer (rows of a larger buffer) receives the rotated q as the
    allocated result would hold it; a buffer of the wrong shape, dtype or layout is refused by name."""
    from trtforge.kernels.fused_layer import rope_and_cache

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(4)
    t, hq, hkv, d, bs, nblocks = 6, 4, 2, 16, 4, 5
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).half().to(device)
    angles = torch.rand(t, d // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, -1).half().to(device)
    sin = torch.cat([angles.sin()] * 2, -1).half().to(device)
    slots = torch.tensor([1, 7, 12, 3, 19, 8], dtype=torch.int32, device=device)
    pools = [torch.zeros(nblocks, bs, hkv, d, dtype=torch.float16, device=device) for _ in range(4)]
    want = rope_and_cache(qkv, cos, sin, slots, pools[0], pools[1], hq, hkv)
    static = torch.full((t + 3, hq, d), float("nan"), dtype=torch.float16, device=device)
    got = rope_and_cache(qkv, cos, sin, slots, pools[2], pools[3], hq, hkv, out=static[:t])
    assert got.data_ptr() == static.data_ptr()
    assert torch.equal(static[:t], want) and static[t:].isnan().all(), "wrote outside its rows"
    assert torch.equal(pools[2], pools[0]) and torch.equal(pools[3], pools[1])
    for bad in (static[: t - 1], static[:t].float(), static[:t].transpose(1, 2)):
        with pytest.raises(ValueError, match="rope_and_cache: out must be"):
            rope_and_cache(qkv, cos, sin, slots, pools[2], pools[3], hq, hkv, out=bad)


@pytest.mark.parametrize(
    ("tokens", "quantization"), [(1, None), (5, None), (5, "fp8")], ids=["gemv", "gemm", "fp8-w8a8"]
)
def test_the_fused_layer_updates_the_residual_stream_in_place(tokens, quantization):
    """``FusedLayers.finish(out=h)`` (a piecewise step's residual stream: cuBLAS accumulates into it at
    GEMM sizes, a quantized product is added to it, the GEMV's result is copied in) equals the result
    in a new tensor; here in Triton's CPU interpreter."""
    pytest.importorskip("triton")
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.executors.fused_layers import FusedLayers
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.quant import quantize_model

    model = tiny_model("llama", num_key_value_heads=2, initializer_range=0.02).half()
    if quantization is not None:
        quantize_model(model, quantization)
    fused = FusedLayers(adapter_for(model))
    assert fused.quantized == (quantization is not None)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, 64, generator=g).half()
    o = torch.randn(tokens, 64, generator=g).half()
    want = fused.finish(0, h, o)
    stream = h.clone()
    got = fused.finish(0, stream, o, out=stream)
    assert got is stream
    torch.testing.assert_close(stream, want, atol=2e-3, rtol=2e-3)
    other = torch.zeros_like(h)
    fused.finish(0, h, o, out=other)
    torch.testing.assert_close(other, want, atol=2e-3, rtol=2e-3)


def _fp8_layer_inputs(dtype: torch.dtype, seed: int) -> tuple:
    """FusedLayers of a tiny FP8 Llama (hidden 64, 2 kv heads of 16) in `dtype`, and a 6-token layer's
    residual stream, attention output, rotary tables and pool slots."""
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.executors.fused_layers import FusedLayers
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.quant import quantize_model

    model = tiny_model("llama", num_key_value_heads=2, initializer_range=0.02).to(dtype)
    quantize_model(model, "fp8")
    fused = FusedLayers(adapter_for(model))
    g = torch.Generator().manual_seed(seed)
    t, d = 6, fused.head_dim
    h = torch.randn(t, 64, generator=g).to(dtype)
    o = torch.randn(t, 64, generator=g).to(dtype)
    angles = torch.rand(t, d // 2, generator=g) * 6
    rope = (torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype))
    return fused, h, o, rope, torch.tensor([1, 7, 12, 3, 19, 8], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("in_place", [False, True], ids=["new", "in-place"])
def test_fp8_layers_quantize_their_gemm_inputs_in_the_producing_kernels(monkeypatch, dtype, in_place):
    """FUSED_FP8_QUANT: a W8A8 layer's norms, residual add and SiLU*up hand E4M3 rows straight to the
    GEMMs (rms_norm_fp8 for qkv, rms_norm_fp8 with o_proj's product as its delta for gate_up,
    silu_mul_fp8 for down; no 16-bit norm or SiLU kernel runs) and the layer's q, pools and residual
    stream equal the separate kernels' exactly (the same codes); here in Triton's CPU interpreter."""
    pytest.importorskip("triton")
    from trtforge.llm.executors import fused_layers

    fused, h, o, rope, slots = _fp8_layer_inputs(dtype, 3)
    d, hkv = fused.head_dim, fused.num_kv_heads

    def layer(fuse: bool) -> tuple[torch.Tensor, ...]:
        monkeypatch.setattr(fused_layers, "FUSED_FP8_QUANT", fuse)
        pools = [torch.zeros(6, 4, hkv, d, dtype=dtype) for _ in range(2)]
        q = fused.attention_input(0, h, rope, slots, *pools)
        stream = h.clone()
        out = fused.finish(0, stream, o, out=stream if in_place else None)
        assert (out is stream) == in_place
        return q, *pools, out

    calls: list[str] = []
    for name in ("rms_norm", "silu_mul", "rms_norm_fp8", "silu_mul_fp8"):
        real = getattr(fused_layers, name)
        monkeypatch.setattr(
            fused_layers, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k)
        )
    want = layer(False)
    assert calls == ["rms_norm", "rms_norm", "silu_mul"]
    calls.clear()
    got = layer(True)
    assert calls == ["rms_norm_fp8", "rms_norm_fp8", "silu_mul_fp8"]
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def _qkv_rows(model: torch.nn.Module) -> list[torch.Tensor]:
    """Copies of every attention projection's weight (FP8: codes as bytes and scales) and bias."""
    from trtforge.llm.quant.linear import QuantLinear

    out = []
    for layer in model.model.layers:
        for m in layer.self_attn.children():
            if isinstance(m, QuantLinear):
                out += [m.qweight.data.view(torch.uint8).clone(), m.qweight.scale.clone()]
            elif isinstance(m, torch.nn.Linear):
                out.append(m.weight.detach().clone())
            if isinstance(m, torch.nn.Linear | QuantLinear) and m.bias is not None:
                out.append(m.bias.detach().clone())
    return out


ROPE_FAMILIES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),  # q/k/v biases
    "qwen3": ("qwen3", {}),  # per-head q/k norms: the two kernels, rows as they are
    "phi3-partial": ("phi3", {}),  # fused qkv_proj, a partial rotary: the two kernels, rows as they are
    "phi3": ("phi3", {"partial_rotary_factor": 1.0}),  # fused qkv_proj, whole heads rotated
}


@pytest.mark.parametrize("quantization", [None, "fp8"], ids=["bf16", "fp8"])
@pytest.mark.parametrize("family", list(ROPE_FAMILIES))
def test_one_token_layers_rope_inside_the_qkv_gemv(monkeypatch, quantization, family):
    """FUSED_ROPE, read when FusedLayers is built: the q/k weight rows (FP8 scales, biases) go into pair
    order in place; one token's q and K/V writes then come from norm_qkv_rope_cache (no rope_and_cache
    launch) and a 3-token step's from rope_and_cache reading the pair order, and equal the served
    kernels' over the rows as they were; the model's own forward is unchanged meanwhile (its modules'
    hooks); a FusedLayers built with it off puts the rows back bit for bit. Qwen3's q/k head norms and
    Phi-4-mini's partial rotary keep the two kernels and leave the rows alone. Triton's CPU interpreter."""
    pytest.importorskip("triton")
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.executors import fused_layers
    from trtforge.llm.executors.fused_layers import FusedLayers
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.quant import quantize_model

    name, overrides = ROPE_FAMILIES[family]
    model = tiny_model(name, num_key_value_heads=2, initializer_range=0.02, **overrides).to(torch.bfloat16)
    if quantization is not None:
        quantize_model(model, quantization)
    fits = family not in ("qwen3", "phi3-partial")
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 300, (1, 7), generator=g)
    with torch.no_grad():
        want_logits = model(ids).logits
    monkeypatch.setattr(fused_layers, "FUSED_ROPE", False)
    fused = FusedLayers(adapter_for(model))
    original = _qkv_rows(model)
    d, hkv = fused.head_dim, fused.num_kv_heads
    rot = int(fused.adapter.rope.describe()["dim"])
    h = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    angles = torch.rand(3, rot // 2, generator=g) * 6
    rope = (torch.cat([angles.cos()] * 2, -1).bfloat16(), torch.cat([angles.sin()] * 2, -1).bfloat16())
    slots = torch.tensor([9, 2, 14], dtype=torch.int32)
    calls: list[str] = []
    for kernel in ("rope_and_cache", "norm_qkv_rope_cache"):
        real = getattr(fused_layers, kernel)
        monkeypatch.setattr(
            fused_layers, kernel, lambda *a, _n=kernel, _f=real, **k: calls.append(_n) or _f(*a, **k)
        )

    def layer(layers: FusedLayers, tokens: int) -> list[torch.Tensor]:
        pools = [torch.zeros(4, 4, hkv, d, dtype=torch.bfloat16) for _ in range(2)]
        r = (rope[0][:tokens], rope[1][:tokens])
        return [layers.attention_input(0, h[:tokens], r, slots[:tokens], *pools), *pools]

    want_one, want_three = layer(fused, 1), layer(fused, 3)
    assert calls == ["rope_and_cache"] * 2
    calls.clear()
    monkeypatch.setattr(fused_layers, "FUSED_ROPE", True)
    paired = FusedLayers(adapter_for(model))
    assert paired.qkv_pairs == [fits] * 2
    moved = [not torch.equal(a, b) for a, b in zip(_qkv_rows(model), original, strict=True)]
    assert any(moved) == fits
    got_one, got_three = layer(paired, 1), layer(paired, 3)
    assert calls == (["norm_qkv_rope_cache"] if fits else ["rope_and_cache"]) + ["rope_and_cache"]
    for a, b in zip(got_one, want_one, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
    for a, b in zip(got_three, want_three, strict=True):
        assert torch.equal(a, b)
    assert want_one[1].abs().sum() > 0 and want_one[2].abs().sum() > 0
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want_logits)
    monkeypatch.setattr(fused_layers, "FUSED_ROPE", False)
    assert FusedLayers(adapter_for(model)).qkv_pairs == [False] * 2
    assert all(torch.equal(a, b) for a, b in zip(_qkv_rows(model), original, strict=True))
    assert all(not m._forward_hooks for m in model.modules())


# every pairing of 16-bit/FP8 weights and KV pools on CUDA; in the interpreter (about 50 s a case, the
# suite's slowest) the two that between them take every weight and pool kind: the kernel's pairings are
# each checked in the interpreter by tests/kernels/test_qkv_rope_cache.py
FUSED_ROPE_CASES = [
    pytest.param(
        device.values[0],
        quantization,
        kv,
        id=f"{kv}-{quantization or 'bf16'}-{device.id}",
        marks=device.marks,
    )
    for device in DEVICES
    for quantization in (None, "fp8")
    for kv in ("auto", "fp8")
    if device.id == "cuda" or (quantization is None) == (kv == "auto")
]


@pytest.mark.parametrize(("device", "quantization", "kv"), FUSED_ROPE_CASES)
def test_fused_rope_serves_the_same_greedy_tokens(monkeypatch, device, quantization, kv):
    """The A/B's shape: one model, executors built in turn with FUSED_ROPE off, on, off (the rows
    permuted and put back in place each time) serve the same greedy tokens (16-bit and FP8 weights,
    16-bit and FP8 KV pools), the fused kernel running at every one-token step with it on (on CUDA:
    into the captured decode graphs)."""
    skip_unless_runs_here(device)
    from tests.llm.serving_models import solo_output
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.executors import fused_layers
    from trtforge.llm.quant import quantize_model

    model = tiny_model("llama").to(torch.bfloat16).to(device)
    if quantization is not None:
        quantize_model(model, quantization)
    fused_calls: list[int] = []
    real = fused_layers.norm_qkv_rope_cache
    monkeypatch.setattr(
        fused_layers, "norm_qkv_rope_cache", lambda *a, **k: fused_calls.append(1) or real(*a, **k)
    )
    prompt = torch.randint(3, 300, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    tokens = []
    for on in (False, True, False):
        monkeypatch.setattr(fused_layers, "FUSED_ROPE", on)
        ex = TorchExecutor(model, num_blocks=16, kernels="triton", kv_cache_dtype=kv, device=device)
        assert ex.fused_refusal is None and ex._fused.qkv_pairs == [on] * 2
        tokens.append(solo_output(prompt, params, ex))
        if device == "cpu":  # 5 one-token steps x 2 layers
            assert len(fused_calls) == (5 * 2 if on else 0)
        assert bool(fused_calls) == on
        fused_calls.clear()
    assert tokens[1] == tokens[0] and tokens[2] == tokens[0], tokens


@pytest.mark.parametrize("device", DEVICES)
def test_qk_norm_and_partial_rotary_kernels_match_the_eager_modules(device):
    """Qwen3's per-head q/k RMSNorm (in place, other heads untouched) and a partial rotary (Phi-4-mini:
    the first 3/4 of each head rotated, the rest passed through to q and the pools) against HF's code."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from trtforge.kernels.fused_layer import qk_norm_, rope_and_cache

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(2)
    t, hq, hkv, d, bs, nblocks = 5, 8, 2, 24, 4, 6
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3).half().to(device)
    norms = []
    for eps in (1e-6, 1e-5):
        norm = Qwen3RMSNorm(d, eps=eps).half().to(device)
        norm.weight.data = (torch.rand(d, generator=g) + 0.5).half().to(device)
        norms.append(norm)
    heads = qkv.view(t, -1, d)
    want = torch.cat([norms[0](heads[:, :hq]), norms[1](heads[:, hq : hq + hkv]), heads[:, hq + hkv :]], 1)
    got = qk_norm_(qkv, *norms, hq, hkv)
    assert got.data_ptr() == qkv.data_ptr()
    torch.testing.assert_close(heads, want, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(heads[:, hq + hkv :], want[:, hq + hkv :], atol=0, rtol=0)

    rot = 18  # 3/4 of 24
    angles = torch.rand(t, rot // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, -1).half().to(device)
    sin = torch.cat([angles.sin()] * 2, -1).half().to(device)
    slots = torch.tensor([3, 22, 0, 9, 14], dtype=torch.int32, device=device)
    k_pool = torch.full((nblocks, bs, hkv, d), float("nan"), dtype=torch.float16, device=device)
    v_pool = k_pool.clone()
    q = rope_and_cache(qkv, cos, sin, slots, k_pool, v_pool, hq, hkv)
    q_ref, k_ref = apply_rotary_pos_emb(
        heads[:, :hq].transpose(0, 1)[None],
        heads[:, hq : hq + hkv].transpose(0, 1)[None],
        cos[None],
        sin[None],
    )
    torch.testing.assert_close(q, q_ref[0].transpose(0, 1), atol=2e-3, rtol=2e-3)
    flat_k, flat_v = k_pool.view(-1, hkv, d), v_pool.view(-1, hkv, d)
    torch.testing.assert_close(flat_k[slots.long()], k_ref[0].transpose(0, 1), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(flat_v[slots.long()], heads[:, hq + hkv :])
    assert torch.equal(q[..., rot:], heads[:, :hq, rot:]), "the unrotated channels changed"
    untouched = torch.ones(nblocks * bs, dtype=torch.bool, device=device)
    untouched[slots.long()] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all(), "wrote outside the slots"
    with pytest.raises(ValueError, match="rotary width"):
        rope_and_cache(qkv, cos[:, :7], sin[:, :7], slots, k_pool, v_pool, hq, hkv)


# What a step of the lockstep runs may hold (step_kinds), each a distinct launch or branch of the executor
# and its kernels: a query row of 1 goes to the decode kernel, 2..8 to its multi-query variant, longer
# ones to the chunked-prefill kernel (64-key tiles).
STEP_KINDS = (
    "mixed",  # decode rows beside prompt pieces
    "decode-only",
    "nothing sampled",  # only mid-prompt chunks
    "one-token prompt",
    "chunk",  # a prompt piece of more than 8 tokens, no keys before it
    "chunk after keys",  # ... with keys before it (an earlier chunk's, or a cached prefix's)
    "chunk past a full tile",  # ... whose first query sees 64+ keys: an unmasked key tile
    "chunks",  # two or more in one step
    "short",  # a prompt piece of 2..8 tokens
    "short after keys",
    "short lengths",  # two or more lengths of them in one step (a launch each)
    "decode past a tile",  # a decode row over more than 64 keys: a second split of the decode kernel
)


def step_kinds(batch) -> set[str]:
    """The STEP_KINDS that `batch` holds."""
    q, ctx = np.asarray(batch.query_lens), np.asarray(batch.context_lens)
    one, short, chunk = q == 1, (q > 1) & (q <= 8), q > 8
    kinds = {
        "mixed": bool(one.any() and (~one).any()),
        "decode-only": bool(batch.is_decode_only),
        "nothing sampled": not len(batch.logits_indices),
        "one-token prompt": bool((one & (ctx == 1)).any()),
        "chunk": bool((chunk & (ctx == q)).any()),
        "chunk after keys": bool((chunk & (ctx > q)).any()),
        "chunk past a full tile": bool((chunk & (ctx - q + 1 >= 64)).any()),
        "chunks": int(chunk.sum()) > 1,
        "short": bool((short & (ctx == q)).any()),
        "short after keys": bool((short & (ctx > q)).any()),
        "short lengths": len(set(q[short].tolist())) > 1,
        "decode past a tile": bool((one & (ctx > 64)).any()),
    }
    return {k for k, held in kinds.items() if held}


class _Lockstep:
    """A StepExecutor running every batch through the reference and the tested executor alike.

    It returns the reference logits, so both see the same schedule however their tokens would
    differ, and records per step the largest logit error (relative to the largest logit) and the
    greedy picks that differ where the reference's top-2 margin is clear of that tolerance.
    """

    def __init__(self, ref: TorchExecutor, test: TorchExecutor, rel_tol: float) -> None:
        self.ref, self.test, self.rel_tol = ref, test, rel_tol
        self.max_rel_err = 0.0
        self.clear_rows = self.rows = self.flipped = 0
        self.mixed_steps = self.decode_steps = 0
        self.kinds: set[str] = set()  # what the steps held (STEP_KINDS)

    def __getattr__(self, name):
        return getattr(self.ref, name)

    def step(self, batch):
        want = self.ref.step(batch).double()
        got = self.test.step(batch).double()
        qlens = batch.query_lens
        self.decode_steps += int(batch.is_decode_only)
        self.mixed_steps += int((qlens > 1).any() and (qlens == 1).any())
        self.kinds |= step_kinds(batch)
        if not want.shape[0]:
            return want.float()  # only mid-prompt chunks: no row is sampled
        scale = float(want.abs().max())
        self.max_rel_err = max(self.max_rel_err, float((got - want).abs().max()) / scale)
        top2 = want.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * self.rel_tol * scale
        self.flipped += int((clear & (got.argmax(-1) != want.argmax(-1))).sum())
        self.clear_rows += int(clear.sum())
        self.rows += int(want.shape[0])
        return want.float()


def _family_model(family: str, **overrides) -> torch.nn.Module:
    """tiny_llama, or the tiny random model of another family (tiny_models) of the same vocabulary."""
    if family == "llama":
        return copy.deepcopy(tiny_llama())
    from tests.llm.tiny_models import tiny_model

    return tiny_model(family, max_position_embeddings=512, **overrides)


# Families whose two tiny layers are alike (what each family adds acts inside every layer), with their
# config's layer count: in Triton's interpreter they run one layer, Llama keeping the fused layers two
# deep; CUDA runs two everywhere
ONE_LAYER_IN_THE_INTERPRETER = {
    "qwen3": "num_hidden_layers",
    "phi3": "num_hidden_layers",
    "gemma": "num_hidden_layers",
    "mixtral": "num_hidden_layers",
    "bloom": "n_layer",
}


# Families whose steps call the Triton attention kernels exactly as another family here does (plain MHA or
# GQA, no window, soft-cap, ALiBi, sinks or head dim of their own: their differences are torch code around
# the same launches, which the torch executor's HF-equality tests hold). In Triton's interpreter (CPU, every
# program emulated: 7-40 s a family) they are left out; the CUDA case runs every family.
SAME_LAUNCHES = (
    "opt",
    "gpt_neox",
    "phi",
    "olmo2",
    "granite",
    "stablelm",
    "gptj",
    "codegen",
    "falcon_40b",
    "falcon_serial",
)


def _family_cases() -> list:
    return [
        pytest.param(device.values[0], family, id=f"{family}-{device.id}", marks=device.marks)
        for family in KERNEL_FAMILIES
        for device in DEVICES
        if not (device.id == "interpreter" and family in SAME_LAUNCHES)
    ]


@pytest.mark.parametrize(("device", "family"), _family_cases())
def test_triton_executor_gives_the_torch_reference_greedy_tokens(device, family):
    """Llama-style models on the fused layers; the others (GPT-2, Gemma's head dim 24, OLMo 2, Granite,
    GPT-NeoX, Phi, OPT, GPT-Neo's local layer, GPT-BigCode's one KV head, StableLM's per-head q/k LayerNorm,
    SmolLM3's NoPE layer, Gemma 3's sliding and full layers, Mixtral's MoE MLPs) on their adapter's layers
    around the Triton attention kernels."""
    skip_unless_runs_here(device)
    fused = family in ("llama", "qwen3", "phi3")  # the others' math is not the fused layers'
    refusal = None if fused else "not Llama-style"
    if family in MOE_FAMILIES:
        refusal = "MoE MLPs (the fused layers run one dense Llama-style MLP a layer)"
    layers = ONE_LAYER_IN_THE_INTERPRETER.get(family) if device != "cuda" else None
    _lockstep_greedy(_family_model(family, **({layers: 1} if layers else {})), device, refusal)


# Llama-style configs the fused layers must follow (each drawn by test_config_variants too, on the torch
# reference): a GQA ratio of 4 and head dim 24, MHA with llama3 rotary, yarn's scaled tables, q/k/v biases
# with linear rotary, a window, Qwen3's head norms at head dim 8 and GQA 1, tied embeddings and eps, CWM's
# per-layer windows
FUSED_VARIANTS = [
    ("llama", {"num_key_value_heads": 1, "head_dim": 24, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}),
    (
        "llama",
        {
            "num_key_value_heads": 4,
            "head_dim": 8,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    (
        "mistral",
        {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128}},
    ),
    ("qwen2", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "num_key_value_heads": 1}),
    ("mistral", {"sliding_window": 20, "head_dim": 16}),
    ("qwen3", {"head_dim": 8, "num_key_value_heads": 1, "tie_word_embeddings": True}),
    ("cwm", {}),  # its own RMSNorm class (Llama's math) and windows by layer_types: 4 keys, then full
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("family", "overrides"), FUSED_VARIANTS)
def test_fused_layers_follow_llama_style_config_variants(device, family, overrides):
    """The fused Llama-style layers (not only the adapter's reference layers) under config options the
    tests' fixed configs do not set: greedy tokens and logits in lockstep with the torch reference."""
    from tests.llm.tiny_models import tiny_model

    skip_unless_runs_here(device)
    # In the interpreter (seconds a layer) one layer: each option acts inside every layer alike, and the
    # greedy-token test runs the fused layers two deep. CWM keeps two (a windowed layer, then a full one).
    layers = {"num_hidden_layers": 1} if device != "cuda" and family != "cwm" else {}
    model = tiny_model(family, max_position_embeddings=512, **layers, **copy.deepcopy(overrides))
    _lockstep_greedy(model, device, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["gemma", "gemma3_text", "gemma2"])
def test_gemma_head_dim_256_on_the_triton_attention_kernels(device, family):
    """Gemma's real head dim (256, the kernels' largest: MAX_HEAD_DIM) through the Triton decode and
    chunked-prefill attention (Gemma 2's soft-capped), in lockstep with the torch reference."""
    from tests.llm.tiny_models import tiny_model

    skip_unless_runs_here(device)
    _lockstep_greedy(tiny_model(family, head_dim=256, max_position_embeddings=512), device, "not Llama-style")


def _lockstep_workload(device: str) -> tuple[list, list[SamplingParams], SchedulerConfig]:
    """The requests _lockstep_greedy serves: (prompts, their sampling params, the scheduler's limits). A
    prompt given as (i, tokens) is added once request i has its first token (its prompt then cached).

    On CUDA: nine random prompts (1-69 tokens, 2-13 new) in 24-token chunks. In Triton's interpreter each
    token of a step costs its fused-layer kernels' programs (about 60 ms a token for tiny_llama) and each
    step its launches, so there six requests of 126 tokens in all (the nine: 326) run in 6 steps (the
    nine: 23), in 20-token chunks, chosen so that the steps hold every STEP_KINDS (the nine held all but
    the one-token prompt and the keys past one tile): a 64-token prompt (a chunk of 20 beside the first
    chunk of a 24-token prompt, nothing sampled; then 20 and 16 after keys, then 8) and the 24-token one
    (then 4 after keys, beside prompts of 1, 5 and 3 tokens); once the first is cached, its 64 tokens and
    10 more (a 10-token chunk past a 64-key cached prefix beside five decode rows, one past 64 keys; the
    six then decode). Chunks of 20 span two 64-row tiles at a GQA group of 4. No step is of one token:
    the fused layers' GEMV (test_the_fused_layer_updates_the_residual_stream_in_place) takes seconds a
    step here.
    """
    rng = np.random.default_rng(4)
    if device == "cuda":
        prompts = [rng.integers(0, 300, size=int(rng.integers(1, 70))).tolist() for _ in range(9)]
        params = [SamplingParams(max_tokens=int(rng.integers(2, 14)), ignore_eos=True) for _ in prompts]
        config = SchedulerConfig(
            max_num_batched_tokens=48, max_prefill_chunk=24, max_prefill_tokens_with_decodes=16
        )
        return prompts, params, config
    first = rng.integers(0, 300, size=64).tolist()
    lens = (24, 1, 5, 3)
    prompts = [first, *(rng.integers(0, 300, size=n).tolist() for n in lens)]
    prompts.append((0, first + rng.integers(0, 300, size=10).tolist()))
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 5, 5, 5, 5, 2)]
    config = SchedulerConfig(
        max_num_batched_tokens=40, max_prefill_chunk=20, max_prefill_tokens_with_decodes=16
    )
    return prompts, params, config


def _lockstep_greedy(base: torch.nn.Module, device: str, refusal: str | None) -> None:
    """The prompts of _lockstep_workload served greedily in lockstep by the torch reference and the Triton
    executor over FP16 `base`, steps mixing prompt chunks and decodes: the fused layers run (or are
    refused for `refusal`), and the logits and clear greedy picks agree."""
    prompts, params, config = _lockstep_workload(device)
    base = base.half()
    kwargs = {"num_blocks": 96, "block_size": 16, "device": device, "max_decode_batch": 8}
    ref = TorchExecutor(copy.deepcopy(base), kernels="torch", **kwargs)
    test = TorchExecutor(copy.deepcopy(base), kernels="triton", **kwargs)
    assert test.fused_refusal == refusal, test.fused_refusal
    both = _Lockstep(ref, test, rel_tol=2e-2)
    # small chunks and step budgets: steps mix prompt chunks (some after keys) and decodes
    sched = make_step_loop(both, config)
    later = {}
    for i, (p, sp) in enumerate(zip(prompts, params)):
        if isinstance(p, tuple):
            later[p[0]] = (i, p[1], sp)
        else:
            sched.add_request(i, p, sp)
    done = {}
    while sched.has_unfinished():
        for out in sched.step():
            if out.request_id in later:  # its first token: its prompt's blocks are cached
                sched.add_request(*later.pop(out.request_id))
            if out.finished:
                done[out.request_id] = out
    assert not later and len(done) == len(prompts)
    assert not [v.error for v in done.values() if v.error is not None]
    assert sum(len(v.output_token_ids) for v in done.values()) == sum(p.max_tokens for p in params)
    assert both.mixed_steps > 0 and both.decode_steps > 0
    if device != "cuda":  # the short workload holds every kind of step (and a 64-token prefix hit)
        assert both.kinds == set(STEP_KINDS), set(STEP_KINDS) - both.kinds
        assert sched.scheduler.stats.prefix_hit_tokens == 64
    assert both.max_rel_err < both.rel_tol
    # (the interpreter's 25 rows: 48-87% of them clear on the 24 models here; the nine prompts' 72: 57%+)
    least = both.rows // 2 if device == "cuda" else both.rows // 3
    assert both.clear_rows >= least, "too few rows with a clear greedy pick to compare"
    assert both.flipped == 0
    if device == "cuda":  # (none of a MoE model the fused MoE kernels cannot run)
        assert (test.num_cuda_graphs > 0) == (test.cuda_graphs_refusal is None)


def test_triton_kernels_are_refused_where_they_cannot_run(monkeypatch):
    from trtforge.errors import UserError

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device runs the kernels")
    with pytest.raises(UserError, match="kernels='triton' needs a CUDA model"):
        TorchExecutor(copy.deepcopy(tiny_llama()), num_blocks=4, kernels="triton")
    assert TorchExecutor(copy.deepcopy(tiny_llama()), num_blocks=4).kernels == "torch"


def test_small_decode_buckets_take_one_tile_a_split():
    from trtforge.kernels.decode_attention import DecodeConfig, default_decode_config
    from trtforge.llm.executors.triton_attention import SMALL_DECODE_WORK, TritonDecodeAttention

    attn = TritonDecodeAttention()
    # batch 1, 4 kv heads: one 64-key tile per split (512 keys: 8, 768: 12), at most 2 programs an SM
    assert attn.config_for(1, 4, 64, 512, num_sms=132).num_splits == 8
    assert attn.config_for(1, 4, 64, 768, num_sms=132).num_splits == 12
    assert attn.config_for(16, 4, 64, 512, num_sms=132).num_splits == 4  # 264 programs // 64
    assert attn.config_for(2, 4, 64, 40, num_sms=132).num_splits == 1  # under one tile
    # small launches prefetch their first tile before the PDL wait; the rest do not (not measured there)
    assert attn.config_for(1, 4, 64, 512, num_sms=132).early_kv
    assert not attn.config_for(64, 4, 64, 512, num_sms=132).early_kv
    # past the small work, and for head dims whose default tiles are not 64 keys: the kernel's default
    assert attn.config_for(64, 4, 64, 512, num_sms=132) == default_decode_config(64, max_keys=512)
    assert SMALL_DECODE_WORK < 64 * 4 * 512
    assert attn.config_for(1, 4, 256, 512, num_sms=132) == default_decode_config(256)
    fixed = DecodeConfig(32, 4, 2, 3)
    assert TritonDecodeAttention(fixed).config_for(1, 4, 64, 512) == fixed


def test_decode_tiles_follow_the_keys_a_launch_may_see(monkeypatch):
    """16-bit pools past the small work: 32-key tiles up to SHORT_DECODE_KEYS keys (the table's width in
    keys), 128-key tiles past it; DECODE_CONFIG_BY_KEYS off keeps 64."""
    from trtforge.kernels import decode_attention as da
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    attn = TritonDecodeAttention()
    pool = torch.zeros(64, 16, 8, 128, dtype=torch.bfloat16)
    block_n = {}
    for width in (8, 16, 17, 47, 48, 96, 192):  # blocks of 16 keys
        tables = torch.zeros(256, width, dtype=torch.int32)
        block_n[width * 16] = attn.pool_config(256, pool, tables, None, torch.device("cpu")).block_n
    assert da.SHORT_DECODE_KEYS == 256
    assert block_n == {128: 32, 256: 32, 272: 128, 752: 128, 768: 128, 1536: 128, 3072: 128}
    # a sliding window bounds the keys: 100 + 1 + 128 keys of a 3,072-key table take short tiles
    wide = torch.zeros(256, 192, dtype=torch.int32)
    assert attn.pool_config(256, pool, wide, 100, torch.device("cpu")) == da.SHORT_KEYS_DECODE_CONFIG
    # ... and so does an attention chunk (Llama 4's chunked layers)
    chunked = attn.pool_config(256, pool, wide, None, torch.device("cpu"), chunk=100)
    assert chunked == da.SHORT_KEYS_DECODE_CONFIG
    # small work (one sequence) still splits 64-key tiles, whatever its keys
    assert attn.config_for(1, 8, 128, 3072, num_sms=132).block_n == 64
    assert da.default_decode_config(256, max_keys=3072).block_n == 32  # wide D: registers rule
    monkeypatch.setattr(da, "DECODE_CONFIG_BY_KEYS", False)
    assert attn.config_for(256, 8, 128, 3072) == da.default_decode_config(128) == da.DecodeConfig(64, 4, 3)


def test_fp8_pools_take_their_own_decode_launch(monkeypatch):
    """FP8 pools launch 128-key tiles (the bytes of a 64-key BF16 tile), chosen from the pool's dtype
    wherever the step plans it: on 2 warps for many (sequence, kv head) pairs at one query a sequence,
    short contexts included since V is read as 16-bit pairs (FP8_KV_MANY_PAIRS_DECODE_CONFIG), else on 4
    (FP8_KV_DECODE_CONFIG)."""
    from trtforge.kernels import decode_attention as da
    from trtforge.kernels.kv_quant import FP8_KV_DTYPE
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    assert (da.FP8_KV_DECODE_CONFIG.block_n, da.FP8_KV_DECODE_CONFIG.num_stages) == (128, 2)
    many = da.FP8_KV_MANY_PAIRS_DECODE_CONFIG
    assert (many.block_n, many.num_warps, many.num_stages) == (128, 2, 2)
    attn = TritonDecodeAttention()
    bf16 = da.default_decode_config(128, max_keys=64 * 16)
    for dtype, want in ((FP8_KV_DTYPE, da.FP8_KV_MANY_PAIRS_DECODE_CONFIG), (torch.bfloat16, bf16)):
        pool = torch.zeros(64, 16, 8, 128, dtype=dtype)
        tables = torch.zeros(256, 64, dtype=torch.int32)
        assert attn.pool_config(256, pool, tables, None, torch.device("cpu")) == want
    fp8 = torch.zeros(64, 16, 8, 128, dtype=FP8_KV_DTYPE)

    def warps(batch: int, width: int, window: int | None = None) -> int:
        tables = torch.zeros(batch, width, dtype=torch.int32)
        return attn.pool_config(batch, fp8, tables, window, torch.device("cpu")).num_warps

    assert da.FP8_KV_TWO_WARPS_MIN_PAIRS == 512
    assert warps(64, 17) == 2  # 512 pairs over 272 keys
    assert warps(63, 512) == 4  # 504 pairs: too few
    assert warps(256, 16) == 2  # 256 keys: short, still many pairs
    assert warps(256, 64, window=100) == 2  # a window of 100 keys bounds them to 229
    assert warps(1, 2048) == 4  # one sequence over 32,768 keys
    # verification rows (2..8 queries a sequence) keep 4 warps: on 2 they spill
    tables = torch.zeros(256, 64, dtype=torch.int32)
    assert attn.pool_config(256, fp8, tables, None, torch.device("cpu"), q_len=4).num_warps == 4
    monkeypatch.setattr(da, "FP8_KV_TWO_WARPS_MIN_PAIRS", float("inf"))
    assert warps(256, 64) == 4
    assert da.default_decode_config(256, FP8_KV_DTYPE) == da.default_decode_config(256)  # wide D: as BF16
    # shared memory counts the pools' bytes: two stages of 256-key FP8 tiles fit, of BF16 ones not
    assert da._fits(256, 2, 128, elem_bytes=1) and not da._fits(256, 2, 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [None, 50])
def test_small_decode_splits_match_the_reference_with_short_and_empty_splits(device, window):
    from trtforge.llm.executors.paged_attention import paged_decode_reference
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(7)
    bs, hq, hkv, d, nblocks, width = 16, 8, 2, 32, 64, 16
    # 256 keys of capacity: 4 splits of one tile; the 5- and 70-key sequences leave splits empty
    ctx = torch.tensor([5, 256, 70], dtype=torch.int32)
    tables = torch.randperm(nblocks, generator=g)[: 3 * width].view(3, width).to(torch.int32)
    k_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half()
    v_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half()
    q = torch.randn(3, hq, d, generator=g).half()
    attn = TritonDecodeAttention()
    assert attn.config_for(3, hkv, d, width * bs).num_splits == 4
    args = [t.to(device) for t in (q, k_pool, v_pool, tables, ctx)]
    got = attn(*args, d**-0.5, window)
    want = paged_decode_reference(
        *(t.double() if t.is_floating_point() else t for t in args), d**-0.5, window
    )
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)


def test_pdl_is_used_on_hopper_cuda_devices_only(monkeypatch):
    from trtforge.kernels import gemv as gemv_kernels

    gemv_kernels.pdl_supported.cache_clear()
    assert not gemv_kernels.pdl_supported(torch.device("cpu"))
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        assert gemv_kernels.pdl_supported(dev) == (torch.cuda.get_device_capability(dev)[0] >= 9)
        monkeypatch.setenv("TRTFORGE_PDL", "0")
        gemv_kernels.pdl_supported.cache_clear()
        assert not gemv_kernels.pdl_supported(dev)
    gemv_kernels.pdl_supported.cache_clear()


def _launch_counts(plan) -> list[tuple[int, int]]:
    """(full, bound) launches of each prepared launch of a step plan (gathered decode rows excepted)."""
    return [
        (f.full_launches, f.bound_launches)
        for v in plan.launches.values()
        for f in v
        if hasattr(f, "full_launches")
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_is_prepared_once_for_all_its_layers_and_again_for_the_next_step(device):
    """Layers with their own pools, scales and queries reuse the step's plan and prepared launches
    (on CUDA launched straight to the compiled kernels after the first layer), each giving the
    reference; a sliding-window layer gets launches of its own; the next step, another batch, a new plan."""
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(5)
    bs, hq, hkv, d, nblocks, layers = 16, 8, 2, 32, 64, 3
    attention = TritonPagedAttention()
    pools = [
        [torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device) for _ in range(2)]
        for _ in range(layers)
    ]
    plans = []
    for ctx_lens, q_lens in (LAYOUTS["decodes-first"], ([20, 64, 9], [1, 30, 9])):
        meta, _ = mixed_metadata(device, g, bs, nblocks, ctx_lens, q_lens)
        plan = attention.plan_of(meta, torch.device(device))
        out = torch.empty(sum(q_lens), hq, d, dtype=torch.float16, device=device)
        for i, (k_pool, v_pool) in enumerate(pools):
            q = torch.randn(sum(q_lens), hq, d, generator=g).half().to(device)
            scale = d**-0.5 * (1 + i / 2)
            got = attention(q, k_pool, v_pool, meta, scale, out=out)
            want = paged_attention_reference(q.double(), k_pool.double(), v_pool.double(), meta, scale)
            torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)
            assert attention.plan_of(meta, torch.device(device)) is plan
        assert len(plan.launches) == 1
        assert _launch_counts(plan) == [(1, layers - 1) if device == "cuda" else (layers, 0)] * 2
        q = torch.randn(sum(q_lens), hq, d, generator=g).half().to(device)
        got = attention(q, *pools[0], meta, d**-0.5, sliding_window=8, out=out)
        want = paged_attention_reference(q.double(), *(p.double() for p in pools[0]), meta, d**-0.5, 8)
        torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)
        assert len(plan.launches) == 2
        plans.append(plan)
    assert plans[1] is not plans[0] and plans[1].decode[1].shape[0] == 1  # one decode row, not two
    prompt_only = attention.plan_of(mixed_metadata(device, g, bs, nblocks, [5], [5])[0], torch.device(device))
    assert prompt_only is not plans[1] and prompt_only.decode is None and not prompt_only.launches


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_mixed_warm_up_steps_hold_every_query_length_and_write_only_the_scratch_block(device, family):
    """The steps capture_mixed_graphs runs so that Triton compiles the mixed steps' attention at load
    (not inside a served step): decode rows, each short query length 2..8 (the split-KV kernel's
    per-length variants) and a prompt chunk; over one key tile, over 512 keys and (a sliding window of
    100) over 101, the window then in force; one sequence of each length, or enough of each for one
    split. They run as served mixed steps do and write nothing but the scratch block."""
    from tests.llm.tiny_models import tiny_model

    skip_unless_runs_here(device)
    # In the interpreter one layer (seconds each): the warm-up batches are the same at any depth and each
    # layer's pools are checked alike; CUDA keeps two
    one = {"num_hidden_layers": 1} if device != "cuda" else {}
    if family == "llama":
        model = (
            tiny_model("llama", max_position_embeddings=512, **one) if one else copy.deepcopy(tiny_llama())
        )
    else:
        model = tiny_model("mistral", sliding_window=100, max_position_embeddings=512, **one)
    ex = TorchExecutor(
        model.half(), num_blocks=16, block_size=16, device=device,
        kernels="triton", max_decode_batch=8, max_model_len=512, static_decode=True,
    )  # fmt: skip
    batches = ex.mixed_warm_up_batches()
    keys = [64, 512] if family == "llama" else [64, 101, 512]
    assert sorted({int(b.context_lens.max()) for b in batches}) == keys
    assert all(sorted(set(b.query_lens.tolist())) == [*range(1, 9), 24] for b in batches)
    many = -(-4 * 132 // 2) + 1 if device != "cuda" else None  # kv heads 2; an H100/H200's SMs off CUDA
    sizes = sorted({b.num_seqs for b in batches})
    assert len(sizes) == 2 and sizes[0] == 9 and (many is None or sizes[1] == 8 * min(256, many) + 1)
    assert all(len(b.logits_indices) == 1 for b in batches)  # the chunk's logits only
    pools = (*ex.k_pools, *ex.v_pools)
    before = [p.clone() for p in pools]
    for batch in [b for b in batches if b.num_seqs == 9]:  # (the many-row steps: on CUDA, below)
        assert ex.path_of(batch) == "piecewise"
        logits = ex.step(batch)
        assert logits.shape == (1, ex.facts.vocab_size) and torch.isfinite(logits).all()
    for old, new in zip(before, pools):
        assert torch.equal(old[:-1], new[:-1]) and not torch.equal(old[-1], new[-1])
    if device == "cuda":
        assert ex.warm_up_mixed_attention() == len(batches)
        for old, new in zip(before, pools):
            assert torch.equal(old[:-1], new[:-1])
    else:
        assert ex.warm_up_mixed_attention() == 0


@pytest.mark.gpu
def test_served_mixed_steps_compile_no_triton_kernel_after_capture():
    """After the load-time capture (decode graphs, piecewise graphs and the mixed attention warm-up), a
    served run whose steps carry prompt pieces of every short length compiles no Triton kernel: each
    compilation inside a step stalled it for about a second (BENCHMARKS.md, session 15)."""
    from triton import knobs

    base = copy.deepcopy(tiny_llama()).half().to("cuda")
    ex = TorchExecutor(base, num_blocks=128, block_size=16, max_decode_batch=8, max_graph_tokens=64)
    ex.capture_decode_graphs()
    ex.capture_mixed_graphs()
    seen: set[int] = set()
    step, step_async = ex.step, ex.step_async
    ex.step = lambda batch: (seen.update(batch.query_lens.tolist()), step(batch))[1]
    ex.step_async = lambda batch, feed: (seen.update(batch.query_lens.tolist()), step_async(batch, feed))[1]
    rng = np.random.default_rng(6)
    config = SchedulerConfig(
        max_num_batched_tokens=48, max_prefill_chunk=24, max_prefill_tokens_with_decodes=16
    )
    sched = make_step_loop(ex, config)
    for i in range(40):
        prompt = rng.integers(3, 290, size=int(rng.integers(1, 70))).tolist()
        sched.add_request(i, prompt, SamplingParams(max_tokens=int(rng.integers(1, 12)), ignore_eos=True))
    compiled: list[str] = []
    hook = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["repr"].split("[")[0])
    try:
        done = run_to_completion(sched)
    finally:
        knobs.runtime.jit_post_compile_hook = hook
    assert len(done) == 40 and not [o.error for o in done.values() if o.error is not None]
    assert set(range(1, 9)) <= seen, sorted(seen)  # decode rows and every short piece length ran
    assert compiled == []


def _two_cuda_layers(g, pool_shape, q_shape, dtype) -> list[list[torch.Tensor]]:
    """Two layers' random [K pool, V pool, q] on the GPU."""
    return [[torch.randn(*shape, generator=g).to(dtype).cuda() for shape in (pool_shape, pool_shape, q_shape)]
            for _ in range(2)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["interleaved", "decodes-first"])
def test_concurrent_decode_and_chunk_launches_give_the_sequential_result(layout):
    """``concurrent``: the decode-kernel launches (decode rows, a 5-token row) on a side stream beside the
    chunk launch, over two layers of one step; the same kernels, so the same bits as one stream."""
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    g = torch.Generator().manual_seed(1)
    bs, hq, hkv, d, nblocks = 16, 8, 2, 64, 64
    ctx_lens, q_lens = LAYOUTS[layout]
    meta, _ = mixed_metadata("cuda", g, bs, nblocks, ctx_lens, q_lens)
    layers = _two_cuda_layers(g, (nblocks, bs, hkv, d), (sum(q_lens), hq, d), torch.float16)
    got = {}
    for concurrent in (False, True):
        attention = TritonPagedAttention(concurrent=concurrent)
        got[concurrent] = [attention(q, k, v, meta, d**-0.5) for k, v, q in layers]
        plan = attention.plan_of(meta, torch.device("cuda"))
        assert (attention._side_stream(plan, layers[0][2]) is not None) == concurrent
    torch.cuda.synchronize()
    for seq, con in zip(got[False], got[True]):
        assert torch.equal(seq, con)


@pytest.mark.gpu
def test_long_chunks_on_the_hopper_kernel_match_the_reference_beside_decodes_and_short_chunks():
    """``hopper_chunks``: in a step with decode rows, a 5-token row, a short chunk and two long ones
    (fresh, and after cached keys), the long chunks run the Hopper kernel and the rest the varlen and
    decode kernels (concurrently), over two layers; the result matches the reference and the all-varlen
    launch's."""
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel needs an sm_90 GPU")
    g = torch.Generator().manual_seed(2)
    bs, hq, hkv, d = 16, 32, 8, 128
    ctx_lens, q_lens = [700, 40, 1300, 90, 300, 33], [1, 1, 600, 20, 300, 5]
    nblocks = sum(-(-c // bs) for c in ctx_lens) + 4
    meta, _ = mixed_metadata("cuda", g, bs, nblocks, ctx_lens, q_lens)
    layers = _two_cuda_layers(g, (nblocks, bs, hkv, d), (sum(q_lens), hq, d), torch.bfloat16)
    got = {}
    for hopper in (False, True):
        attention = TritonPagedAttention(hopper_chunks=hopper)
        got[hopper] = [attention(q, k, v, meta, d**-0.5) for k, v, q in layers]
        plan = attention.plan_of(meta, torch.device("cuda"))
        assert (plan.long_chunks is not None) == hopper
        if hopper:
            assert plan.long_chunks[0] == [(2, 600, 1300), (622, 300, 300)]
            assert plan.short_chunks is not None and int(plan.short_chunks[1].tolist()[0]) == 20
    torch.cuda.synchronize()
    for (k, v, q), varlen, hop in zip(layers, got[False], got[True]):
        want = paged_attention_reference(q.double(), k.double(), v.double(), meta, d**-0.5)
        torch.testing.assert_close(hop.double(), want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(hop.float(), varlen.float(), atol=2e-2, rtol=2e-2)
    (held,) = attention._gather.values()  # one gather scratch, kept for the next steps
    assert held[0].shape[0] >= sum(-(-c // bs) for c in (1300, 300)) and held[0].shape[0] % 1024 == 0


@pytest.mark.gpu
def test_long_chunks_stay_on_the_varlen_kernel_past_the_key_cap(monkeypatch):
    """A step whose long chunks see more than HOPPER_CHUNK_MAX_KEYS keys in all gathers nothing (its
    scratch would grow without bound): all its chunks go to the varlen kernel."""
    from trtforge.kernels import chunked_prefill
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper chunk path is planned on sm_90 GPUs only")
    device = "cuda"
    g = torch.Generator().manual_seed(4)
    meta, _ = mixed_metadata(device, g, 16, 200, [700, 1300], [300, 600])
    attention = TritonPagedAttention()
    assert attention.plan_of(meta, torch.device(device)).long_chunks is not None
    monkeypatch.setattr(chunked_prefill, "HOPPER_CHUNK_MAX_KEYS", 1999)
    attention = TritonPagedAttention()
    plan = attention.plan_of(meta, torch.device(device))
    assert plan.long_chunks is None and plan.chunks is not None


def test_long_chunk_plan_picks_the_long_chunks_and_their_blocks(monkeypatch):
    """The Hopper chunk path's plan (host arrays only): chunks of 256+ tokens, with their first rows,
    query tokens and keys, the shorter chunks left to the varlen kernel, and flat table indices that
    name exactly the long chunks' blocks in order; none past the key cap."""
    from trtforge.kernels import chunked_prefill
    from trtforge.llm.executors.triton_attention import long_chunk_plan

    g = torch.Generator().manual_seed(2)
    ctx_lens, q_lens = [700, 40, 1300, 90, 300, 33], [1, 1, 600, 20, 300, 5]
    meta, tables = mixed_metadata("cpu", g, 16, 200, ctx_lens, q_lens)
    chunks = np.array([2, 3, 4, 5])
    spans, rest, pages = long_chunk_plan(meta, chunks)
    assert spans == [(2, 600, 1300), (622, 300, 300)]
    assert rest.tolist() == [3, 5]
    assert meta.block_tables.reshape(-1)[torch.from_numpy(pages)].tolist() == tables[2] + tables[4]
    assert long_chunk_plan(meta, np.array([3, 5])) == (None, None, None)
    monkeypatch.setattr(chunked_prefill, "HOPPER_CHUNK_MAX_KEYS", 1599)
    assert long_chunk_plan(meta, chunks) == (None, None, None)


def test_the_hopper_chunk_launch_refuses_what_it_cannot_run():
    """Mismatched block lists, configs that spill the chunk variant, and scratch that cannot hold the
    blocks are refused when the launch is prepared, naming what was expected."""
    pytest.importorskip("triton.experimental.gluon")
    from trtforge.kernels.chunked_prefill import hopper_chunks_eligible, prepare_chunked_prefill_hopper
    from trtforge.kernels.configs import HopperConfig

    k = torch.zeros(40, 16, 2, 64, dtype=torch.bfloat16)
    q = torch.zeros(600, 8, 64, dtype=torch.bfloat16)
    spans, pages = [(0, 300, 500)], torch.arange(32, dtype=torch.int32)
    assert not hopper_chunks_eligible(q, k, None)  # (no sm_90 GPU here)
    with pytest.raises(ValueError, match="need 32 pages of 16 keys; got 31"):
        prepare_chunked_prefill_hopper(q, k, k, spans, pages[:31])
    with pytest.raises(ValueError, match="2 consumer warpgroups"):
        prepare_chunked_prefill_hopper(q, k, k, spans, pages, HopperConfig(3, 128, 4, 1))
    with pytest.raises(ValueError, match="cannot hold 32 blocks"):
        prepare_chunked_prefill_hopper(q, k, k, spans, pages, scratch=(k[:8], k[:8]))
    with pytest.raises(ValueError, match="share one"):
        prepare_chunked_prefill_hopper(q, k, k[:, :8], spans, pages)
    # FP8 pools are gathered widened to the query's type: scratch of FP8 codes cannot take them
    fp8 = k.to(torch.float8_e4m3fn)
    prepare_chunked_prefill_hopper(q, fp8, fp8, spans, pages, scratch=(k, k))
    with pytest.raises(ValueError, match="cannot hold 32 blocks of torch.bfloat16"):
        prepare_chunked_prefill_hopper(q, fp8, fp8, spans, pages, scratch=(fp8, fp8))
