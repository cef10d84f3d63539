"""Fused Llama-style layer pieces for the torch executor on CUDA (Triton): fewer, larger kernels per token.

A decode step at batch 1 is ~20 tiny kernels per layer in eager Hugging Face code (RMSNorm alone
is six), and their launch gaps, not the weights' bytes, set its time even inside a CUDA graph.
Here a layer is: RMSNorm (one kernel), one QKV GEMM over concatenated weights, one kernel that
applies RoPE to q and k and writes k and v into their paged-pool slots, attention, the output
projection with the residual add folded into the GEMM (addmm), RMSNorm, one gate+up GEMM, one
SiLU-and-multiply kernel, and the down projection with its residual add. At decode-sized token
counts (<= ``gemv_max_tokens``: one token by default) the projections run instead as Triton
GEMVs (:mod:`.gemv_kernels`) with the norms, SiLU*mul and residual adds folded in: norm+QKV,
o_proj+residual, norm+gate/up+SiLU, down+residual, and norm+lm_head.

The concatenated weights replace the modules' own parameters with views into them, so the model
keeps working unchanged and no weight is held twice. Phi-3's fused qkv_proj and gate_up_proj are used
as they are. Qwen3's per-head q/k RMSNorms run as one in-place kernel over the QKV GEMM's output, before
the RoPE + cache-write kernel, which also rotates only the leading channels of a partial rotary.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtforge.kernels.gemv import (
    MAX_ROWS,
    gemv_residual,
    norm_gate_up_silu,
    norm_gemv,
    pdl_supported,
)

# Token counts up to this run the projections as GEMVs (FusedLayers.gemv_max_tokens; at most
# gemv_kernels.MAX_ROWS). On an H200 (TinyLlama-1.1B shapes, benchmarks/bench_decode_layer.py,
# results/decode_layer.json) the one-row GEMVs took 32.8 us per layer against 44.0 us for cuBLAS + the
# separate norm/SiLU kernels, and the batch-1 decode graph 1.03 ms against 1.32 ms; from two rows on
# cuBLAS is as fast or faster (45.3 vs 44.4 us at two rows, 106.6 vs 44.5 at eight), so one token only.
GEMV_MAX_TOKENS = 1


@triton.jit
def _rms_norm_kernel(X, W, Out, stride_x, stride_o, n_cols, eps, BLOCK: tl.constexpr):
    """One row: x * rsqrt(mean(x^2) + eps) rounded to the input dtype, times the weight (as HF does)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n_cols
    x = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    y = (x * rstd).to(Out.dtype.element_ty).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (y * w).to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _qk_norm_kernel(QKV, WQ, WK, stride_t, num_heads, eps_q, eps_k, D: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (T, Hq + Hkv), in place: RMSNorm of token t's head h of ``qkv`` with q_norm's weight for a
    query head and k_norm's for a key head (rounded as HF's per-head RMSNorm)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    ok = offs < D
    ptr = QKV + t * stride_t + h * D + offs
    x = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
    is_q = h < num_heads
    rstd = tl.rsqrt(tl.sum(x * x, 0) / D + tl.where(is_q, eps_q, eps_k))
    y = (x * rstd).to(QKV.dtype.element_ty).to(tl.float32)
    wq = tl.load(WQ + offs, mask=ok & is_q, other=0.0).to(tl.float32)
    wk = tl.load(WK + offs, mask=ok & (h >= num_heads), other=0.0).to(tl.float32)
    tl.store(ptr, (y * tl.where(is_q, wq, wk)).to(QKV.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(GU, Out, stride_gu, stride_o, inter, BLOCK: tl.constexpr):
    """out = silu(gate) * up over [T, 2I] rows holding gate then up; each rounded like eager fp16 ops."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    g = tl.load(GU + row * stride_gu + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + inter + offs, mask=ok, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(Out.dtype.element_ty).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (act * u).to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _rope_cache_kernel(
    QKV,
    Cos,
    Sin,
    Slots,
    QOut,
    KPool,
    VPool,
    stride_t,
    stride_cos,
    stride_qo_t,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    num_heads,
    num_kv_heads,
    PAGE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (T, 2): program 0 ropes token t's query heads into QOut; program 1 ropes its key heads and
    writes keys and values to pool slot Slots[t] (block Slots[t] // PAGE, offset Slots[t] % PAGE).
    The rotation covers a head's first 2 * HALF channels; channels 2 * HALF .. D (a partial rotary's
    rest; none when D is 2 * HALF) pass through unrotated.
    PDL: launched early (programmatic dependent launch), it waits for the previous kernel's writes."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_ok = offs_d < HALF
    c1 = tl.load(Cos + t * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    c2 = tl.load(Cos + t * stride_cos + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s1 = tl.load(Sin + t * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s2 = tl.load(Sin + t * stride_cos + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    row = QKV + t * stride_t
    d2 = D
    offs_p = 2 * HALF + tl.arange(0, BLOCK_PASS)
    p_ok = offs_p < D
    if part == 0:
        ok = (offs_h < num_heads)[:, None] & d_ok[None, :]
        base = row + offs_h[:, None] * d2 + offs_d[None, :]
        x1 = tl.load(base, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF, mask=ok, other=0.0).to(tl.float32)
        dst = QOut + t * stride_qo_t + offs_h[:, None] * d2 + offs_d[None, :]
        tl.store(dst, (x1 * c1[None, :] - x2 * s1[None, :]).to(QOut.dtype.element_ty), mask=ok)
        tl.store(dst + HALF, (x2 * c2[None, :] + x1 * s2[None, :]).to(QOut.dtype.element_ty), mask=ok)
        if D > 2 * HALF:
            pok = (offs_h < num_heads)[:, None] & p_ok[None, :]
            src = row + offs_h[:, None] * d2 + offs_p[None, :]
            dst_p = QOut + t * stride_qo_t + offs_h[:, None] * d2 + offs_p[None, :]
            tl.store(dst_p, tl.load(src, mask=pok, other=0.0), mask=pok)
    else:
        slot = tl.load(Slots + t).to(tl.int64)
        blk = slot // PAGE
        off = slot % PAGE
        ok = (offs_h < num_kv_heads)[:, None] & d_ok[None, :]
        kbase = row + (num_heads + offs_h[:, None]) * d2 + offs_d[None, :]
        vbase = row + (num_heads + num_kv_heads + offs_h[:, None]) * d2 + offs_d[None, :]
        x1 = tl.load(kbase, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(kbase + HALF, mask=ok, other=0.0).to(tl.float32)
        kd = KPool + blk * stride_kb + off * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :]
        tl.store(kd, (x1 * c1[None, :] - x2 * s1[None, :]).to(KPool.dtype.element_ty), mask=ok)
        tl.store(kd + HALF, (x2 * c2[None, :] + x1 * s2[None, :]).to(KPool.dtype.element_ty), mask=ok)
        vd = VPool + blk * stride_vb + off * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :]
        tl.store(vd, tl.load(vbase, mask=ok, other=0.0), mask=ok)
        tl.store(vd + HALF, tl.load(vbase + HALF, mask=ok, other=0.0), mask=ok)
        if D > 2 * HALF:
            pok = (offs_h < num_kv_heads)[:, None] & p_ok[None, :]
            kp = KPool + blk * stride_kb + off * stride_kn + offs_h[:, None] * stride_kh + offs_p[None, :]
            vp = VPool + blk * stride_vb + off * stride_vn + offs_h[:, None] * stride_vh + offs_p[None, :]
            ksrc = row + (num_heads + offs_h[:, None]) * d2 + offs_p[None, :]
            vsrc = row + (num_heads + num_kv_heads + offs_h[:, None]) * d2 + offs_p[None, :]
            tl.store(kp, tl.load(ksrc, mask=pok, other=0.0), mask=pok)
            tl.store(vp, tl.load(vsrc, mask=pok, other=0.0), mask=pok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of `x` ``[T, H]`` (as transformers' LlamaRMSNorm computes it)."""
    out = torch.empty_like(x)
    n = int(x.shape[-1])
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x, weight, out, x.stride(0), out.stride(0), n, float(eps),
            BLOCK=triton.next_power_of_2(n), num_warps=8 if n >= 2048 else 4,
        )  # fmt: skip
    return out


def qk_norm_(qkv: torch.Tensor, q_norm: Any, k_norm: Any, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """In place: RMSNorm each query head of ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` with `q_norm` and each key
    head with `k_norm` (Qwen3's per-head norms, modules with ``weight`` [D] and ``variance_epsilon``)."""
    t, d = int(qkv.shape[0]), int(q_norm.weight.shape[0])
    if t:
        _qk_norm_kernel[(t, num_heads + num_kv_heads)](
            qkv, q_norm.weight, k_norm.weight, qkv.stride(0), num_heads,
            float(q_norm.variance_epsilon), float(k_norm.variance_epsilon),
            D=d, BLOCK=triton.next_power_of_2(d), num_warps=1 if d <= 256 else 4,
        )  # fmt: skip
    return qkv


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[T, 2I]`` (gate in the first I columns) -> ``[T, I]``."""
    t, inter = int(gate_up.shape[0]), int(gate_up.shape[1]) // 2
    out = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = 1024
        _silu_mul_kernel[(t, triton.cdiv(inter, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4
        )
    return out


def rope_and_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """Rotate q and k of ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` by ``cos``/``sin`` ``[T, R]`` (rotate-half RoPE
    over each head's first R <= D channels, R even), write k and v at pool slots ``slots`` ``[T]`` (pools
    ``[nb, bs, Hkv, D]``); return q ``[T, Hq, D]``."""
    t = int(qkv.shape[0])
    d, rot = int(k_pool.shape[-1]), int(cos.shape[-1])
    if rot % 2 or rot > d:
        raise ValueError(f"rope_and_cache: rotary width {rot} must be even and at most the head dim {d}")
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    if t:
        half = rot // 2
        pdl = pdl_supported(qkv.device)
        _rope_cache_kernel[(t, 2)](
            qkv, cos, sin, slots, q, k_pool, v_pool,
            qkv.stride(0), cos.stride(0), q.stride(0),
            k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
            v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
            num_heads, num_kv_heads,
            PAGE=int(k_pool.shape[1]), HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_H=triton.next_power_of_2(max(num_heads, num_kv_heads)),
            D=d, BLOCK_PASS=triton.next_power_of_2(max(d - rot, 1)), PDL=pdl, num_warps=4,
            launch_pdl=pdl,
        )  # fmt: skip
    return q


_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Phi3RMSNorm")


def _mlp_projections(mlp: Any) -> list[Any]:
    """The gated MLP's linear layers: gate_up_proj (Phi-3) or gate_proj and up_proj; then down_proj."""
    fused = getattr(mlp, "gate_up_proj", None)
    return [fused, mlp.down_proj] if fused is not None else [mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def fusable(model: Any) -> str | None:
    """None when `model`'s layers fit the fused path, else why not (a one-line reason)."""
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} (the fused MLP is SiLU-gated)"
    layers = list(model.model.layers)
    attn = layers[0].self_attn
    if attn.head_dim % 2:
        return f"odd head dim {attn.head_dim}"
    for layer in layers:
        a = layer.self_attn
        if a.o_proj.bias is not None or any(p.bias is not None for p in _mlp_projections(layer.mlp)):
            return "biased output or MLP projections"
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if getattr(a, "q_norm", None) is not None:
            norms += [a.q_norm, a.k_norm]
        for norm in norms:
            if not hasattr(norm, "variance_epsilon") or type(norm).__name__ not in _RMS_NORMS:
                return f"norm {type(norm).__name__}"
    return None


def _concat_into_views(modules: list[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the modules' weights (and biases) along dim 0; repoint each module at its slice."""
    weight = torch.cat([m.weight.data for m in modules])
    has_bias = [m.bias is not None for m in modules]
    bias = torch.cat([m.bias.data for m in modules]) if all(has_bias) else None
    if any(has_bias) and bias is None:
        raise ValueError("either every projection has a bias or none does")
    lo = 0
    for m in modules:
        hi = lo + int(m.weight.shape[0])
        m.weight.data = weight[lo:hi]
        if bias is not None:
            m.bias.data = bias[lo:hi]
        lo = hi
    return weight, bias


class FusedLayers:
    """The per-layer weights of the fused path; `qkv`/`finish` mirror the executor's arch methods."""

    def __init__(self, model: Any) -> None:
        self.model, self.inner = model, model.model
        self.layers = list(self.inner.layers)
        self.qkv_w: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.gate_up_w: list[torch.Tensor] = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            fused = getattr(a, "qkv_proj", None)  # Phi-3: already [q; k; v] by heads
            qkv = (fused.weight, fused.bias) if fused is not None else None
            self.qkv_w.append(qkv or _concat_into_views([a.q_proj, a.k_proj, a.v_proj]))
            gate_up = getattr(m, "gate_up_proj", None)  # Phi-3: already [gate; up]
            self.gate_up_w.append(
                gate_up.weight if gate_up is not None else _concat_into_views([m.gate_proj, m.up_proj])[0]
            )
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.num_heads = int(model.config.num_attention_heads)
        self.num_kv_heads = int(model.config.num_key_value_heads or self.num_heads)
        self.gemv_max_tokens = min(GEMV_MAX_TOKENS, MAX_ROWS)

    def _gemv(self, h: torch.Tensor) -> bool:
        return 0 < int(h.shape[0]) <= self.gemv_max_tokens

    def attention_input(
        self,
        i: int,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """Norm, QKV projection, q/k head norms (Qwen3), RoPE and the K/V write of layer i; returns q
        ``[T, Hq, D]``."""
        layer = self.layers[i]
        norm = layer.input_layernorm
        w, b = self.qkv_w[i]
        if self._gemv(h):
            qkv = norm_gemv(h, norm.weight, norm.variance_epsilon, w, b)
        else:
            qkv = torch.nn.functional.linear(rms_norm(h, norm.weight, norm.variance_epsilon), w, b)
        attn = layer.self_attn
        if getattr(attn, "q_norm", None) is not None:
            qk_norm_(qkv, attn.q_norm, attn.k_norm, self.num_heads, self.num_kv_heads)
        return rope_and_cache(qkv, *rope, slots, k_pool, v_pool, self.num_heads, self.num_kv_heads)

    def finish(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Output projection + residual, norm, gated MLP + residual."""
        layer = self.layers[i]
        norm = layer.post_attention_layernorm
        if self._gemv(h):
            h = gemv_residual(o.reshape(h.shape[0], -1).contiguous(), layer.self_attn.o_proj.weight, h)
            a = norm_gate_up_silu(h, norm.weight, norm.variance_epsilon, self.gate_up_w[i])
            return gemv_residual(a, layer.mlp.down_proj.weight, h)
        h = torch.addmm(h, o.reshape(h.shape[0], -1), layer.self_attn.o_proj.weight.t())
        x = rms_norm(h, norm.weight, norm.variance_epsilon)
        a = silu_mul(torch.nn.functional.linear(x, self.gate_up_w[i]))
        return torch.addmm(h, a, layer.mlp.down_proj.weight.t())

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        norm, head = self.inner.norm, self.model.lm_head
        if self._gemv(h):
            return norm_gemv(h, norm.weight, norm.variance_epsilon, head.weight, head.bias)
        return head(rms_norm(h, norm.weight, norm.variance_epsilon))
