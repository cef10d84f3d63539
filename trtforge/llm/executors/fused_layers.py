"""The fused Llama-style layer of the torch executor on CUDA: a model's weights driven through
trtforge's Triton layer kernels (:mod:`trtforge.kernels.fused_layer`, :mod:`trtforge.kernels.gemv`).

A layer is: RMSNorm, one QKV GEMM over concatenated weights, Qwen3's q/k head norms, one kernel that
applies RoPE and writes k and v into their paged-pool slots, attention, the output projection with
the residual add folded into the GEMM (addmm), RMSNorm, one gate+up GEMM, one SiLU-and-multiply
kernel, and the down projection with its residual add. At decode-sized token counts (<=
``gemv_max_tokens``: one token by default) the projections run instead as Triton GEMVs with the
norms, SiLU*mul and residual adds folded in: norm+QKV, o_proj+residual, norm+gate/up+SiLU,
down+residual, and norm+lm_head.

The concatenated weights replace the modules' own parameters with views into them, so the model
keeps working unchanged and no weight is held twice. Quantized projections
(:class:`~trtforge.llm.quant.linear.QuantLinear`) concatenate their quantized rows the same way; the
GEMVs read them directly up to :func:`~trtforge.llm.quant.linear.weight_only_max_tokens` (FP8 at one
token, weight-only: E4M3 widened in registers against the 16-bit activations; INT4 up to 16: no INT4
tensor-core GEMM here), larger token counts go through :func:`~trtforge.llm.quant.linear.quant_linear`
(FP8: W8A8, per-token activation scales and ``torch._scaled_mm``). A quantized LM head
(``lm_head_quantization="fp8"``) takes the same norm + GEMV at up to its own weight-only limit (one
token), whatever the projections' limit (INT4's 16 rows), so it runs what the CPU's ``quant_linear`` runs.
Phi-3's fused qkv_proj and gate_up_proj are used as they are. :func:`fusable` says which models fit
(SiLU-gated MLP, RMSNorms, unbiased o/MLP projections, an even head dim).

Under tensor parallelism (a ``tp`` group, :mod:`trtforge.llm.models.parallel`) the weights are the
rank's shard: o_proj and down_proj multiply the rank's input columns, rank 0 alone folds the residual
into its GEMM (GEMV), and one all-reduce sums the partial products, so the residual counts once; the
LM head's vocabulary shares are all-gathered.
"""

from __future__ import annotations

from typing import Any

import torch

from trtforge.kernels import has_wgmma
from trtforge.kernels.fused_layer import (
    norm_qkv_rope_cache,
    pair_rows,
    qk_norm_,
    qkv_rope_fusable,
    qkv_rope_takes,
    rms_norm,
    rms_norm_fp8,
    rope_and_cache,
    silu_mul,
    silu_mul_fp8,
)
from trtforge.kernels.gemm_mid import mid_gemm
from trtforge.kernels.gemv import MAX_ROWS, gemv_residual, norm_gate_up_silu, norm_gemv
from trtforge.kernels.gemv import prepare as prepare_gemv_weight
from trtforge.kernels.qweight import Fp8Weight, cat_weights
from trtforge.llm.models.llama import LlamaStyle
from trtforge.llm.quant.linear import QuantLinear, quant_linear, weight_only_max_tokens

# Token counts up to this run the projections as GEMVs (FusedLayers.gemv_max_tokens; at most
# kernels.gemv.MAX_ROWS). On an H200 (TinyLlama-1.1B shapes, benchmarks/bench_decode_layer.py,
# results/decode_layer.json) the one-row GEMVs took 32.8 us per layer against 44.0 us for cuBLAS + the
# separate norm/SiLU kernels, and the batch-1 decode graph 1.03 ms against 1.32 ms; from two rows on
# cuBLAS is as fast or faster (45.3 vs 44.4 us at two rows, 106.6 vs 44.5 at eight), so one token only.
GEMV_MAX_TOKENS = 1
# 16-bit projections of MID_GEMM_MIN_TOKENS..MID_GEMM_MAX_TOKENS tokens run trtforge's Triton GEMM
# (trtforge.kernels.gemm_mid; Hopper only) instead of cuBLAS: decode-sized batches, where cuBLAS's
# BF16 GEMMs ran at 350-600 TFLOP/s on the H200 (session 13). 0 and 0, off: not measured on the H200
# yet (benchmarks/sweep_mid_gemm.py times both).
MID_GEMM_MIN_TOKENS = 0
MID_GEMM_MAX_TOKENS = 0

# W8A8 layers (FP8 weights above their weight-only token count) take their GEMMs' inputs quantized by
# the kernel that produces them: RMSNorm + quantize, residual add + RMSNorm + quantize (after o_proj),
# SiLU*up + quantize; the rows are never written in 16 bits and read back for a separate quantize.
# Same codes as the unfused kernels. False: the separate kernels.
FUSED_FP8_QUANT = True

# One token's norm + QKV GEMV carries RoPE and the K/V write in its epilogue
# (kernels.fused_layer.norm_qkv_rope_cache) where it takes the layer: 16-bit or FP8 weights, no Qwen3
# q/k head norms, a rotary over whole heads; one launch a layer fewer. Read when FusedLayers is built:
# on, those layers' q and k weight rows (FP8 scales, biases) are put in pair order in place
# (_order_qkv_rows: a transient copy of one layer's q/k rows at a time, no second copy kept); off, back
# in their own order, bit for bit. Steps of more tokens (prefill, batched decode) run the same GEMMs over
# the permuted rows and rope_and_cache reads their output in pair order (pairs=True): no extra kernel or
# copy. The model's own q/k modules put their outputs back in order with one index_select each (a
# forward hook; the fused path never calls them). Off until the GPU timing says otherwise (issue #28;
# over rows in their own order the kernel was slower on an H100: BENCHMARKS session 60). A/B, one
# executor a round: bench_quant_speed.py --ab base trtforge.llm.executors.fused_layers.FUSED_ROPE=True
FUSED_ROPE = False


def _is_llama_rms_norm(norm: Any) -> bool:
    """Whether `norm` computes Llama's RMSNorm (float32 statistics, weight times the normalized input in its
    dtype): a ``forward`` compiled to LlamaRMSNorm's bytecode, names and constants. transformers copies that
    forward into each family's own class (Qwen3RMSNorm, CwmRMSNorm, SeedOssRMSNorm...), so the test is what
    the class computes, not its name; Gemma's (1 + weight) or OLMo 2's order differ and are refused."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    forward = getattr(type(norm), "forward", None)
    code, ref = getattr(forward, "__code__", None), LlamaRMSNorm.forward.__code__
    return (
        code is not None
        and hasattr(norm, "variance_epsilon")
        and isinstance(getattr(norm, "weight", None), torch.Tensor)
        and (code.co_code, code.co_consts, code.co_names, code.co_varnames)
        == (ref.co_code, ref.co_consts, ref.co_names, ref.co_varnames)
    )


def _use_mid_gemm(x: torch.Tensor, w: Any) -> bool:
    """Whether ``x @ w^T`` goes to trtforge's mid-sized GEMM (see MID_GEMM_MIN_TOKENS)."""
    m = int(x.shape[0])
    if not (MID_GEMM_MIN_TOKENS <= m <= MID_GEMM_MAX_TOKENS and m > 0 and isinstance(w, torch.Tensor)):
        return False
    return (
        x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and w.dtype == x.dtype
        and x.stride(1) == 1
        and w.stride(1) == 1
        and has_wgmma(x.device)
    )


def _mlp_projections(mlp: Any) -> list[Any]:
    """The gated MLP's linear layers: gate_up_proj (Phi-3) or gate_proj and up_proj; then down_proj."""
    fused = getattr(mlp, "gate_up_proj", None)
    return [fused, mlp.down_proj] if fused is not None else [mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def fusable(adapter: LlamaStyle) -> str | None:
    """None when the adapted model's layers fit the fused path, else why not (a one-line reason). Its
    layers are Llama's exactly, so a model with anything more is refused here: attention logit soft-caps
    (Gemma 2's) and ALiBi slopes (BLOOM's, MPT's, falcon-rw's; no Llama-style family sets either) among
    it, as are an attention output gate, attention sinks and chunked attention layers."""
    config = adapter.config
    if any(cap is not None for cap in adapter.softcaps):
        return "attention logit soft-capping (Llama-style layers have none)"
    if any(slopes is not None for slopes in adapter.alibi_slopes):
        return "ALiBi position biases (Llama-style layers have none)"
    if any(sinks is not None for sinks in adapter.sinks):
        return "attention sinks (Llama-style layers have none)"
    if adapter.output_gate is not None:
        return f"an attention output gate ({adapter.output_gate.phrase()}; Llama-style layers have none)"
    if any(chunk is not None for chunk in adapter.chunks):
        return (
            "chunked attention layers (attention_chunk_size; the fused layers' attention has no chunk mask)"
        )
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} (the fused MLP is SiLU-gated)"
    if adapter.head_dim % 2:
        return f"odd head dim {adapter.head_dim}"
    for layer in adapter.layers:
        a = layer.self_attn
        if a.o_proj.bias is not None or any(p.bias is not None for p in _mlp_projections(layer.mlp)):
            return "biased output or MLP projections"
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if getattr(a, "q_norm", None) is not None:
            norms += [a.q_norm, a.k_norm]
        for norm in norms:
            if not _is_llama_rms_norm(norm):
                return f"norm {type(norm).__name__}"
    return None


def _weight(module: Any) -> Any:
    """A projection's weight: its tensor, or its quantized weight (:mod:`trtforge.kernels.qweight`)."""
    return module.qweight if isinstance(module, QuantLinear) else module.weight


def _concat_key(modules: list[Any]) -> list[tuple[Any, int | None]]:
    """What a cached concatenation of quantized `modules` must still match: each module's quantized-weight
    object (compared by identity) and its bias's storage (a moved, cast or reassigned bias misses)."""
    return [(m.qweight, None if m.bias is None else m.bias.data.data_ptr()) for m in modules]


def _same_key(a: list[tuple[Any, int | None]], b: list[tuple[Any, int | None]]) -> bool:
    return len(a) == len(b) and all(wa is wb and pa == pb for (wa, pa), (wb, pb) in zip(a, b, strict=True))


def _concat_biases(modules: list[Any]) -> torch.Tensor | None:
    """The projections' biases concatenated along dim 0 (quantized or not: biases stay unquantized), or
    None where none has one; a mix is refused (the fused GEMM adds one bias or none)."""
    has_bias = [m.bias is not None for m in modules]
    if any(has_bias) and not all(has_bias):
        raise ValueError("either every projection has a bias or none does")
    return torch.cat([m.bias.data for m in modules]) if all(has_bias) else None


def _concat_into_views(modules: list[Any]) -> tuple[Any, torch.Tensor | None]:
    """Concatenate the modules' weights (and biases) along dim 0; repoint each module at its slice.

    Quantized projections concatenate their quantized rows (every format quantizes per output row), once:
    a second FusedLayers over the same modules (the pool sizing's probe executor, then the served one)
    reuses the first's concatenation, with whatever :func:`prepare_gemv_weight` made for it (the INT4
    tensor-core packing), so the sizing's free-memory reading already holds it."""
    cached = getattr(modules[0], "_trtforge_concat", None)
    if cached is not None and _same_key(cached[2], _concat_key(modules)):
        return cached[0], cached[1]
    if isinstance(modules[0], QuantLinear):
        qweight = cat_weights([m.qweight for m in modules])
        qbias = _concat_biases(modules)
        lo = 0
        for m in modules:
            hi = lo + int(m.out_features)
            m.qweight = qweight.rows(lo, hi)
            if qbias is not None:
                m.bias.data = qbias[lo:hi]
            lo = hi
        modules[0]._trtforge_concat = (qweight, qbias, _concat_key(modules))
        return qweight, qbias
    weight = torch.cat([m.weight.data for m in modules])
    bias = _concat_biases(modules)
    lo = 0
    for m in modules:
        hi = lo + int(m.weight.shape[0])
        m.weight.data = weight[lo:hi]
        if bias is not None:
            m.bias.data = bias[lo:hi]
        lo = hi
    return weight, bias


def _permute_rows_(weight: Any, bias: torch.Tensor | None, rows: int, index: torch.Tensor) -> None:
    """In place: row r < `rows` of `weight` (FP8: its codes and per-row scales) and of `bias` takes row
    ``index[r]``; the rows past `rows` stay. One temporary copy of those rows at a time. E4M3 codes move
    as bytes (an index kernel for every dtype, and a bit-exact move)."""
    fp8 = isinstance(weight, Fp8Weight)
    tensors = [weight.data.view(torch.uint8), weight.scale] if fp8 else [weight]
    with torch.no_grad():
        for t in [*tensors, *([] if bias is None else [bias])]:
            t[:rows].copy_(t[:rows].index_select(0, index))


def _natural_output(index: torch.Tensor) -> Any:
    """A forward hook putting a projection's output columns, computed by pair-ordered rows, back in the
    module's own order (`index`: its columns' positions in the pair order)."""

    def hook(_module: Any, _args: Any, output: torch.Tensor) -> torch.Tensor:
        return output.index_select(-1, index.to(output.device))

    return hook


def _order_qkv_rows(
    modules: list[Any], weight: Any, bias: torch.Tensor | None, pairs: bool, heads: tuple[int, int, int]
) -> None:
    """Put one layer's concatenated QKV rows (`weight`, `bias`) in pair order
    (:func:`~trtforge.kernels.fused_layer.pair_rows`, `pairs`) or back in their own order, in place (no
    second copy of the weights). `modules` (q_proj and k_proj, or Phi-3's qkv_proj) hold views of those
    rows: while they are pair-ordered each carries a forward hook that puts its output columns back in
    order (one index_select a call; the fused path never calls them), so the model itself computes what
    it did, and the hook marks the state, which a later FusedLayers over the same modules reads (their
    16-bit weights are concatenated again from these views; quantized ones reuse the concatenation). So
    an earlier FusedLayers over quantized modules must not run after one built under the other setting
    (its rows moved under it); the A/B builds one executor a round and drops it after."""
    if (getattr(modules[0], "_trtforge_pair_hook", None) is not None) == pairs:
        return
    num_heads, num_kv_heads, head_dim = heads
    device = weight.data.device if isinstance(weight, Fp8Weight) else weight.device
    perm = pair_rows(num_heads, num_kv_heads, head_dim, device)
    inverse = torch.argsort(perm)
    rows = (num_heads + num_kv_heads) * head_dim  # q and k; v stays
    _permute_rows_(weight, bias, rows, perm[:rows] if pairs else inverse[:rows])
    lo = 0
    for m in modules:
        if pairs:
            hi = lo + int(_weight(m).shape[0])
            m._trtforge_pair_hook = m.register_forward_hook(_natural_output(inverse[lo:hi] - lo))
            lo = hi
        else:
            m._trtforge_pair_hook.remove()
            del m._trtforge_pair_hook


class FusedLayers:
    """The per-layer weights of the fused path for a :func:`fusable` model; :meth:`attention_input`,
    :meth:`finish` and :meth:`logits` stand in for the adapter's layer math around the attention."""

    def __init__(self, adapter: LlamaStyle, tp: Any = None) -> None:
        self.adapter, self.tp = adapter, tp
        self.model, self.inner = adapter.model, adapter.body
        self.layers = adapter.layers
        self.qkv_w: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.gate_up_w: list[Any] = []
        self.o_w: list[Any] = []
        self.down_w: list[Any] = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            fused = getattr(a, "qkv_proj", None)  # Phi-3: already [q; k; v] by heads
            qkv = (_weight(fused), fused.bias) if fused is not None else None
            self.qkv_w.append(qkv or _concat_into_views([a.q_proj, a.k_proj, a.v_proj]))
            gate_up = getattr(m, "gate_up_proj", None)  # Phi-3: already [gate; up]
            self.gate_up_w.append(
                _weight(gate_up) if gate_up is not None else _concat_into_views([m.gate_proj, m.up_proj])[0]
            )
            self.o_w.append(_weight(a.o_proj))
            self.down_w.append(_weight(m.down_proj))
        self.head_dim, self.num_heads = adapter.head_dim, adapter.num_heads
        self.num_kv_heads = adapter.num_kv_heads
        self.gemv_max_tokens = min(GEMV_MAX_TOKENS, MAX_ROWS)
        self.quantized = not isinstance(self.o_w[0], torch.Tensor)
        if self.quantized:  # the same boundary as quant_linear's (INT4: no tensor-core GEMM, 16 rows)
            self.gemv_max_tokens = weight_only_max_tokens(self.o_w[0])
        head = self.model.lm_head
        self.head_w = _weight(head)
        self.head_gemv_max_tokens = self.gemv_max_tokens
        for i in range(len(self.layers)):  # (the forms each weight is used in: norm, gated, residual)
            prepare_gemv_weight(self.qkv_w[i][0], norm=True)
            prepare_gemv_weight(self.gate_up_w[i], gated=True, norm=True)
            prepare_gemv_weight(self.o_w[i])
            prepare_gemv_weight(self.down_w[i])
        prepare_gemv_weight(self.head_w, norm=True)
        # layers whose q/k rows are in pair order for norm_qkv_rope_cache (FUSED_ROPE, where it takes them)
        self.qkv_pairs = [FUSED_ROPE and self._rope_fits(i) for i in range(len(self.layers))]
        for i, pairs in enumerate(self.qkv_pairs):
            attn = self.layers[i].self_attn
            fused = getattr(attn, "qkv_proj", None)
            modules = [fused] if fused is not None else [attn.q_proj, attn.k_proj]
            heads = (self.num_heads, self.num_kv_heads, self.head_dim)
            _order_qkv_rows(modules, *self.qkv_w[i], pairs, heads)
        if isinstance(head, QuantLinear):  # (FP8: weight-only at one token, W8A8 above)
            self.head_gemv_max_tokens = min(self.gemv_max_tokens, weight_only_max_tokens(self.head_w))

    def _rope_fits(self, i: int) -> bool:
        """Whether norm_qkv_rope_cache takes layer i at one token: weights it takes (qkv_rope_takes)
        for the model's rotary, and no Qwen3 q/k head norms (they come between the GEMV and RoPE)."""
        w, b = self.qkv_w[i]
        rotary = int(self.adapter.rope.describe()["dim"])
        return getattr(self.layers[i].self_attn, "q_norm", None) is None and qkv_rope_takes(
            w, b, self.num_heads, self.num_kv_heads, self.head_dim, rotary
        )

    def _gemv(self, h: torch.Tensor) -> bool:
        return 0 < int(h.shape[0]) <= self.gemv_max_tokens

    def _fused_fp8_input(self, h: torch.Tensor, w: Any) -> bool:
        """Whether `w`'s product at h's token count is W8A8 with its input quantized by the kernel that
        produces it (:data:`FUSED_FP8_QUANT`): the norm or SiLU before it hands over ``Fp8Rows``."""
        return FUSED_FP8_QUANT and isinstance(w, Fp8Weight) and int(h.shape[0]) > weight_only_max_tokens(w)

    def attention_input(
        self,
        i: int,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Norm, QKV projection, q/k head norms (Qwen3), RoPE and the K/V write of layer i (FP8 pools:
        quantized with `k_scale` / `v_scale`); returns q ``[T, Hq, D]``, written into `out` when given."""
        layer = self.layers[i]
        norm = layer.input_layernorm
        w, b = self.qkv_w[i]
        pairs = self.qkv_pairs[i]
        if (
            pairs
            and self._gemv(h)
            and qkv_rope_fusable(h, w, b, rope[0], k_pool, self.num_heads, self.num_kv_heads)
        ):
            return norm_qkv_rope_cache(
                h, norm.weight, norm.variance_epsilon, w, b, *rope, slots, k_pool, v_pool,
                self.num_heads, self.num_kv_heads, k_scale, v_scale, out=out,
            )  # fmt: skip
        if self._gemv(h):
            qkv = norm_gemv(h, norm.weight, norm.variance_epsilon, w, b)
        elif self._fused_fp8_input(h, w):
            qkv = quant_linear(rms_norm_fp8(h, norm.weight, norm.variance_epsilon)[1], w, b)
        else:
            qkv = self._linear(rms_norm(h, norm.weight, norm.variance_epsilon), w, b)
        attn = layer.self_attn
        if getattr(attn, "q_norm", None) is not None:
            qk_norm_(qkv, attn.q_norm, attn.k_norm, self.num_heads, self.num_kv_heads)
        return rope_and_cache(
            qkv,
            *rope,
            slots,
            k_pool,
            v_pool,
            self.num_heads,
            self.num_kv_heads,
            k_scale,
            v_scale,
            out=out,
            pairs=pairs,
        )

    def finish(
        self, i: int, h: torch.Tensor, o: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Output projection + residual, norm, gated MLP + residual; into `out` when given, which may be
        `h` itself (a piecewise step's residual stream, updated in place: 16-bit GEMMs accumulate into
        it, quantized ones add their product to it, GEMVs copy their result in)."""
        layer = self.layers[i]
        norm = layer.post_attention_layernorm
        o = o.reshape(h.shape[0], -1)
        gate_up = self.gate_up_w[i]
        if self.tp is None and self._fused_fp8_input(h, self.o_w[i]) and self._fused_fp8_input(h, gate_up):
            # o_proj's product joins the residual inside the norm's kernel, which quantizes for gate_up
            y = quant_linear(o, self.o_w[i])
            h, x = rms_norm_fp8(h, norm.weight, norm.variance_epsilon, delta=y, out=out)
            a = silu_mul_fp8(quant_linear(x, gate_up))
            return self._row_parallel(a, self.down_w[i], h, out)
        h = self._row_parallel(o, self.o_w[i], h, out)
        if self._gemv(h):
            a = norm_gate_up_silu(h, norm.weight, norm.variance_epsilon, gate_up)
        elif self._fused_fp8_input(h, gate_up):
            a = silu_mul_fp8(quant_linear(rms_norm_fp8(h, norm.weight, norm.variance_epsilon)[1], gate_up))
        else:
            a = silu_mul(self._linear(rms_norm(h, norm.weight, norm.variance_epsilon), gate_up, None))
        return self._row_parallel(a, self.down_w[i], h, out)

    def _row_parallel(
        self, x: torch.Tensor, w: Any, residual: torch.Tensor, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``residual + x @ w.T`` with the residual folded into the GEMM (GEMV), written into `into` when
        given (which may be `residual`: cuBLAS then accumulates in place, a quantized product is added
        in place). Under tensor parallelism `w` holds this rank's input columns: rank 0 folds the
        residual into its partial product, the others add zeros, and one all-reduce sums them, so the
        residual counts exactly once."""
        if self.tp is not None and self.tp.rank != 0:
            residual = torch.zeros_like(residual)
        if self._gemv(residual):
            out = gemv_residual(x.contiguous(), w, residual)
        elif _use_mid_gemm(x, w):
            out = mid_gemm(x, w, residual=residual)
        elif into is not None and self.tp is None:  # in place: no result tensor to copy in
            if not isinstance(w, torch.Tensor):
                quant_linear(x, w, residual=residual, out=into)  # the product, then one add into `into`
                return into
            if into is not residual:
                into.copy_(residual)
            return into.addmm_(x, w.t())
        elif isinstance(w, torch.Tensor):
            out = torch.addmm(residual, x, w.t())
        else:
            out = quant_linear(x, w, residual=residual)
        out = out if self.tp is None else self.tp.all_reduce(out)
        return out if into is None else into.copy_(out)

    @staticmethod
    def _linear(x: torch.Tensor, w: Any, b: torch.Tensor | None) -> torch.Tensor:
        if _use_mid_gemm(x, w):
            return mid_gemm(x, w, bias=b)
        if isinstance(w, torch.Tensor):
            return torch.nn.functional.linear(x, w, b)
        return quant_linear(x, w, b)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM-head logits (a quantized head: its quantized weight, through the same norm + GEMV); under
        tensor parallelism the head holds this rank's vocabulary rows
        (:class:`~trtforge.llm.models.parallel.VocabParallelHead`) and the shares are gathered."""
        norm, head = self.inner.norm, self.model.lm_head
        if 0 < int(h.shape[0]) <= self.head_gemv_max_tokens:
            out = norm_gemv(h, norm.weight, norm.variance_epsilon, self.head_w, head.bias)
            return out if self.tp is None else head.gather(out)
        return head(rms_norm(h, norm.weight, norm.variance_epsilon))
