"""`quantize_model`: the checks and the rewrite behind ``from_pretrained(..., quantization=...)``.

The Llama-style projections (q/k/v or Phi-3's qkv_proj, o_proj, gate/up or gate_up_proj, down_proj)
become :class:`~trtforge.llm.quant.linear.QuantLinear` modules; the embeddings and norms stay in the
model's dtype, and so does the LM head unless ``lm_head_quantization="fp8"`` asks for it (it is the
most sensitive projection, but at Llama-3-8B its 1.05 GB of BF16 are read at every decoded token).
Every method quantizes per output channel (INT4 in groups of 128 along K within it), so the fused
path's concatenated QKV and gate/up weights are the concatenations of the quantized rows.

- ``"fp8"``: E4M3 weights with per-output-channel scales: W8A8 (activations quantized per token at
  run time) above one token, weight-only at one token (:mod:`.linear`). On CUDA it needs FP8 tensor
  cores (compute capability 8.9+: Ada, Hopper and later).
- ``"int4-rtn"``: INT4 weight-only, asymmetric (scale + offset per group of 128), round to nearest.
- ``"int4-awq"``: the same format with AWQ's activation-aware scales and clipping ranges (:mod:`.awq`),
  searched on calibration prompts.

``lm_head_quantization="fp8"`` (with any of these, or none): the LM head in the same FP8 format and
dispatch as the fp8 projections (weight-only at one token: the fused path's norm + GEMV; W8A8 above).
A head tied to the input embedding leaves the embedding exact: the FP8 head is a copy beside it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trtforge._usercode import eval_mode
from trtforge.errors import UserError
from trtforge.kernels.qweight import INT4_GROUP, QuantWeight, quantize_fp8, quantize_int4
from trtforge.llm.models.families import LlamaStyle, adapter_for
from trtforge.llm.models.moe import refuse_moe
from trtforge.llm.prompts import check_calib_prompts
from trtforge.llm.quant.awq import search_clip, search_scales
from trtforge.llm.quant.linear import QuantLinear

QUANTIZATIONS = ("fp8", "int4-awq", "int4-rtn")
LM_HEAD_QUANTIZATIONS = ("fp8",)
FP8_GEMM_MULTIPLE = 16  # torch._scaled_mm (the FP8 W8A8 GEMM on CUDA) takes weights whose N and K it divides
MAX_CALIB_TOKENS = 16384  # calibration tokens used at most (prompts in order, each cut to 2048 or
# the model's positions)
MAX_SEARCH_ROWS = 16384  # tokens (evenly spaced) whose Gram matrix scores each alpha
MAX_CLIP_ROWS = 16384  # and each clipping ratio


@dataclass
class QuantizationRecord:
    """What :func:`quantize_model` did: the method of the layers' projections (None: left in the model's
    dtype), how many and their bytes before and after, for AWQ the calibration tokens and each scaled
    group's alpha; the LM head's method (None: kept), its bytes before and after and whether it was
    tied to the input embedding (which then stays, exact, beside the FP8 copy)."""

    method: str | None
    projections: int
    bytes_before: int
    bytes_after: int
    calib_tokens: int = 0
    alphas: dict[str, float] = field(default_factory=dict)
    lm_head: str | None = None
    lm_head_bytes_before: int = 0
    lm_head_bytes_after: int = 0
    lm_head_tied: bool = False

    @property
    def unquantized(self) -> str:
        """What stayed in the model's dtype."""
        if self.lm_head is None:
            return "embeddings, norms and lm_head (model dtype)"
        tied = "; the input embedding tied to lm_head stays exact" if self.lm_head_tied else ""
        return f"embeddings and norms (model dtype){tied}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "projections": self.projections,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "unquantized": self.unquantized,
            "calib_tokens": self.calib_tokens,
            "alphas": dict(self.alphas),
            "lm_head": self.lm_head,
            "lm_head_bytes_before": self.lm_head_bytes_before,
            "lm_head_bytes_after": self.lm_head_bytes_after,
            "lm_head_tied": self.lm_head_tied,
        }


def model_quantization(model: nn.Module) -> str | None:
    """The method of the model's quantized layer projections (the LM head aside), or None."""
    head = getattr(model, "lm_head", None)
    return next((m.method for m in model.modules() if isinstance(m, QuantLinear) and m is not head), None)


def model_lm_head_quantization(model: nn.Module) -> str | None:
    """The method of the model's quantized LM head, or None when it is in the model's dtype."""
    head = getattr(model, "lm_head", None)
    return head.method if isinstance(head, QuantLinear) else None


def check_quantization(quantization: Any, where: str = "quantization") -> str | None:
    """`quantization` itself (None, or one of :data:`QUANTIZATIONS`), else a UserError."""
    if quantization is None or quantization in QUANTIZATIONS:
        return quantization
    raise UserError(
        f"{where} {quantization!r} is not supported; choose one of {', '.join(QUANTIZATIONS)} (or none)."
    )


def check_lm_head_quantization(value: Any, where: str = "lm_head_quantization") -> str | None:
    """`value` itself (None, or one of :data:`LM_HEAD_QUANTIZATIONS`), else a UserError."""
    if value is None or value in LM_HEAD_QUANTIZATIONS:
        return value
    raise UserError(
        f"{where} {value!r} is not supported; choose {', '.join(LM_HEAD_QUANTIZATIONS)} (E4M3 with per-row "
        "scales) or none (the LM head in the model's dtype)."
    )


def _groups(layer: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """The layer's projections by shared input: qkv, o, gate/up, down (names of the module attributes)."""
    a, m = layer.self_attn, layer.mlp
    qkv = [a.qkv_proj] if hasattr(a, "qkv_proj") else [a.q_proj, a.k_proj, a.v_proj]
    gate_up = [m.gate_up_proj] if hasattr(m, "gate_up_proj") else [m.gate_proj, m.up_proj]
    return [("qkv", qkv), ("o", [a.o_proj]), ("gate_up", gate_up), ("down", [m.down_proj])]


def _check_model(model: nn.Module, method: str | None, user: str, what: str) -> LlamaStyle:
    """The model's adapter when `what` (the option asked for, for the messages) applies to it; the layer
    projections are checked when `method` quantizes them."""
    adapter = adapter_for(model, user)
    llama = "llama, mistral, ministral, qwen2, qwen3, phi3"
    refuse_moe(model, what, f"the dense MLPs of the Llama-style families ({llama})")
    if not isinstance(adapter, LlamaStyle):
        raise UserError(
            f"{what}: the {model.config.model_type} family ({type(model).__name__}) has no "
            "quantized path yet; quantization covers the Llama-style families (llama, mistral, ministral, "
            "qwen2, qwen3, phi3, internlm3, seed_oss). Serve this model without quantization."
        )
    if method is None:
        return adapter
    for i, layer in enumerate(adapter.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "down_proj") or not (hasattr(mlp, "gate_proj") or hasattr(mlp, "gate_up_proj")):
            raise UserError(
                f"{what}: {model.config.model_type} layer {i} has no gated MLP "
                "(gate/up/down projections); the quantized path covers gated-MLP Llama-style models."
            )
        for name, mods in _groups(layer):
            for mod in mods:
                if not isinstance(mod, nn.Linear):
                    raise UserError(
                        f"{what}: layer {i}'s {name} projection is a {type(mod).__name__}, "
                        "not an nn.Linear (already quantized?); quantize the original model once."
                    )
                k = int(mod.in_features)
                if method.startswith("int4") and k % INT4_GROUP:
                    raise UserError(
                        f"{what}: layer {i}'s {name} projection has {k} input features, "
                        f"not a multiple of the INT4 group size {INT4_GROUP}."
                    )
    return adapter


def _check_head(model: nn.Module, what: str) -> nn.Linear:
    """The LM head `what` (``lm_head_quantization=...``) quantizes: an nn.Linear whose shape the FP8
    GEMM on CUDA takes."""
    head = model.lm_head
    if not isinstance(head, nn.Linear):
        raise UserError(
            f"{what}: the model's lm_head is a {type(head).__name__}, not an nn.Linear (already quantized, "
            "or a tensor-parallel share?); quantize the original model once, with tensor_parallel_size=1."
        )
    n, k = (int(d) for d in head.weight.shape)
    device = head.weight.device
    if device.type == "cuda" and (n % FP8_GEMM_MULTIPLE or k % FP8_GEMM_MULTIPLE):
        raise UserError(
            f"{what}: the LM head is [{n}, {k}] (vocabulary x hidden); on CUDA its FP8 GEMM "
            f"(torch._scaled_mm) needs both multiples of {FP8_GEMM_MULTIPLE}. Keep the head in the model's "
            "dtype (lm_head_quantization=None)."
        )
    return head


def _check_device(model: nn.Module, method: str, what: str | None = None) -> None:
    what = what or f"quantization={method!r}"
    device = next(model.parameters()).device
    if method == "fp8" and device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            name = torch.cuda.get_device_name(device)
            other = (
                "Use quantization='int4-awq' or 'int4-rtn', or no quantization."
                if what.startswith("quantization")
                else "Keep the LM head in the model's dtype (lm_head_quantization=None)."
            )
            raise UserError(
                f"{what} needs FP8 tensor cores (compute capability 8.9 or later: Ada, Hopper, "
                f"Blackwell); {name} has {cap[0]}.{cap[1]}. {other}"
            )
    if device.type not in ("cuda", "cpu"):
        raise UserError(f"{what} runs on CUDA or the CPU, not on {device.type}.")


class _Stop(Exception):
    """Raised by a hook to end a calibration forward after the last decoder layer (the LM head unrun)."""


@dataclass
class _LayerCall:
    """One prompt's call of one decoder layer: its positional and keyword arguments (attention mask,
    position embeddings: what the model computed once for every layer), the hidden states first."""

    args: tuple
    kwargs: dict[str, Any]

    def run(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """`layer` on `hidden` with this call's other arguments; its output hidden states."""
        if self.args:
            out = layer(hidden, *self.args[1:], **self.kwargs)
        else:
            out = layer(**{**self.kwargs, "hidden_states": hidden})
        return out[0] if isinstance(out, tuple) else out

    @property
    def hidden(self) -> torch.Tensor:
        return self.args[0] if self.args else self.kwargs["hidden_states"]


@torch.no_grad()
def _layer_calls(model: nn.Module, layers: list[nn.Module], ids: torch.Tensor) -> list[_LayerCall]:
    """Every decoder layer's call as the model makes it for prompt `ids`, from one forward that stops
    after the last layer. The search then runs the layers one at a time on cached hidden states: one
    layer forward per layer and prompt, not the whole prefix again for each layer (L(L+1)/2 forwards)."""
    seen: list[_LayerCall] = []

    def grab(_mod: Any, args: tuple, kwargs: dict) -> None:
        if seen:  # past the first layer only the other arguments are kept: hidden states come from the search
            args = (None, *args[1:]) if args else args
            kwargs = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        seen.append(_LayerCall(tuple(args), dict(kwargs)))

    def stop(*_: Any) -> None:
        raise _Stop

    hooks = [layer.register_forward_pre_hook(grab, with_kwargs=True) for layer in layers]
    hooks.append(layers[-1].register_forward_hook(stop))
    try:
        with contextlib.suppress(_Stop):
            model(input_ids=ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    if len(seen) != len(layers):
        raise RuntimeError(f"a calibration forward called {len(seen)} of the model's {len(layers)} layers")
    return seen


@torch.no_grad()
def _layer_inputs(
    layer: nn.Module, calls: list[_LayerCall], hidden: list[torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Run `layer` on each prompt's `hidden` (with that prompt's `calls` arguments): each projection
    group's input ``[T, K]`` over the prompts, and the layer's outputs (the next layer's inputs)."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, mods in _groups(layer):

        def grab(_mod: Any, args: tuple, name: str = name) -> None:
            seen.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]))

        hooks.append(mods[0].register_forward_pre_hook(grab))
    try:
        outputs = [call.run(layer, h) for call, h in zip(calls, hidden)]
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.cat(v) for k, v in seen.items()}, outputs


def _calibration(
    prompts: Any, device: torch.device, vocab: int, method: str, max_len: int = 2048
) -> list[torch.Tensor]:
    """The prompts as id tensors, each cut to `max_len` (2048, or fewer positions the model has), at most
    MAX_CALIB_TOKENS in all."""
    what = f"quantization={method!r} calibration prompts"
    if prompts is None or isinstance(prompts, (str, bytes)) or not len(prompts):
        raise UserError(
            f"quantization={method!r} needs calibration prompts for its activation-aware scale search: "
            "calib_prompts=[[token ids], ...] (CLI: --calib-data FILE, one prompt per line as "
            "space-separated token ids)."
        )
    check_calib_prompts(prompts)
    out, total = [], 0
    for b, p in enumerate(prompts):
        ids = [int(t) for t in p][:max_len]
        if not ids or any(not 0 <= t < vocab for t in ids):
            raise UserError(f"{what}: prompt {b} must be a non-empty list of token ids in 0..{vocab - 1}.")
        ids = ids[: MAX_CALIB_TOKENS - total]
        out.append(torch.tensor(ids, dtype=torch.long, device=device))
        total += len(ids)
        if total >= MAX_CALIB_TOKENS:
            break
    return out


@torch.no_grad()
def _awq_layer(
    layer: nn.Module, index: int, inputs: dict[str, torch.Tensor], alphas: dict
) -> dict[nn.Module, torch.Tensor]:
    """Search and fold layer `index`'s scales on its groups' `inputs` (:func:`_layer_inputs`), then
    search its projections' clip ratios (returned by module; the caller quantizes). The folds keep the
    float model's function: later layers see the same inputs."""
    inputs = {k: _rows(v, MAX_SEARCH_ROWS) for k, v in inputs.items()}
    attn, mlp = layer.self_attn, layer.mlp
    v = getattr(attn, "v_proj", None)
    o_folds = (
        [("rows", v.weight)] if v is not None and v.weight.shape[0] == attn.o_proj.weight.shape[1] else []
    )
    folds = {
        "qkv": [("norm", layer.input_layernorm.weight)],
        "gate_up": [("norm", layer.post_attention_layernorm.weight)],
        "down": [("rows", _up_rows(mlp))],
        "o": o_folds,
    }
    clips: dict[nn.Module, torch.Tensor] = {}
    for name, mods in _groups(layer):
        x = inputs[name]
        if folds[name]:
            s, alpha, _ = search_scales(x, [m.weight for m in mods])
            alphas[f"layers.{index}.{name}"] = alpha
            for m in mods:
                m.weight.mul_(s.to(m.weight.dtype)[None, :])
            for kind, target in folds[name]:
                target.div_((s if kind == "norm" else s[:, None]).to(target.dtype))
            x = x / s.to(x.dtype)
        xc = _rows(x, MAX_CLIP_ROWS)
        for m in mods:
            if m is getattr(attn, "q_proj", None) or m is getattr(attn, "k_proj", None):
                continue
            clips[m] = search_clip(xc, m.weight, INT4_GROUP)
    return clips


def _rows(x: torch.Tensor, limit: int) -> torch.Tensor:
    """At most `limit` rows of `x`, evenly spaced (the search's cost grows with the tokens)."""
    if x.shape[0] <= limit:
        return x
    return x[torch.linspace(0, x.shape[0] - 1, limit, device=x.device).long()]


def _up_rows(mlp: nn.Module) -> torch.Tensor:
    """The up projection's rows (a view: Phi-3's gate_up_proj holds them in its second half)."""
    if hasattr(mlp, "gate_up_proj"):
        w = mlp.gate_up_proj.weight
        return w[w.shape[0] // 2 :]
    return mlp.up_proj.weight


def quantize_model(
    model: nn.Module,
    method: str | None,
    calib_prompts: Any = None,
    user: str = "quantization",
    lm_head_quantization: str | None = None,
) -> QuantizationRecord | None:
    """Quantize `model`'s Llama-style projections in place with `method` and, with
    `lm_head_quantization` ("fp8"), its LM head (None, None: leave it as is and return None).

    Run it after the model is on its device and in its dtype. ``"int4-awq"`` needs `calib_prompts`
    (lists of token ids); its search runs on the float model, LM head included."""
    method = check_quantization(method)
    lm_head_quantization = check_lm_head_quantization(lm_head_quantization)
    if method is None and lm_head_quantization is None:
        return None
    what = f"quantization={method!r}" if method else f"lm_head_quantization={lm_head_quantization!r}"
    adapter = _check_model(model, method, user, what)
    if method is not None:
        _check_device(model, method)
    head = None
    if lm_head_quantization is not None:
        head_what = f"lm_head_quantization={lm_head_quantization!r}"
        head = _check_head(model, head_what)
        _check_device(model, lm_head_quantization, head_what)
    device = next(model.parameters()).device
    record = QuantizationRecord(method, 0, 0, 0)
    # a prompt runs at most the positions the model has: past them (RoPE extrapolates without an error)
    # the activations the scales are searched on are ones served text never makes
    positions = getattr(model.config, "max_position_embeddings", None)
    max_len = min(2048, positions) if isinstance(positions, int) and positions > 0 else 2048
    prompts = (
        _calibration(calib_prompts, device, int(model.config.vocab_size), method, max_len)
        if method == "int4-awq"
        else []
    )
    record.calib_tokens = sum(int(p.numel()) for p in prompts)
    with eval_mode(model):
        _quantize(model, adapter, method, head, lm_head_quantization, prompts, record)
    return record


def _quantize(
    model: nn.Module,
    adapter: Any,
    method: str | None,
    head: nn.Linear | None,
    lm_head_quantization: str | None,
    prompts: list[torch.Tensor],
    record: QuantizationRecord,
) -> None:
    """The searches and replacements of :func:`quantize_model`, in eval mode; `record` filled in."""
    clips: dict[nn.Module, torch.Tensor] = {}
    if prompts:  # every search on the float model first: each layer's inputs are the float model's
        layers = list(adapter.layers)
        calls = [_layer_calls(model, layers, ids) for ids in prompts]
        hidden = [c[0].hidden for c in calls]
        for i, layer in enumerate(layers):
            inputs, hidden = _layer_inputs(layer, [c[i] for c in calls], hidden)
            clips.update(_awq_layer(layer, i, inputs, record.alphas))
    if method is not None:
        for layer in adapter.layers:
            for _, mods in _groups(layer):
                for mod in mods:
                    q = _replace(model, mod, method, clips.get(mod))
                    record.projections += 1
                    record.bytes_before += mod.weight.numel() * mod.weight.element_size()
                    record.bytes_after += q.nbytes
    if head is not None:
        embed = model.get_input_embeddings()
        record.lm_head = lm_head_quantization
        record.lm_head_tied = embed is not None and head.weight is embed.weight
        record.lm_head_bytes_before = head.weight.numel() * head.weight.element_size()
        record.lm_head_bytes_after = _replace(model, head, lm_head_quantization, None).nbytes


def _replace(model: nn.Module, mod: nn.Linear, method: str, clip: torch.Tensor | None) -> QuantWeight:
    """Put a :class:`QuantLinear` of `mod` in its place (every parent that holds it); its weight."""
    w = mod.weight.detach()
    q = quantize_fp8(w) if method == "fp8" else quantize_int4(w, INT4_GROUP, clip)
    new = QuantLinear(q, mod.bias, method)
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is mod:
                setattr(parent, name, new)
    return q
