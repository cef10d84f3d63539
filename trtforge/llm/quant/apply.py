"""`quantize_model`: the checks and the rewrite behind ``from_pretrained(..., quantization=...)``.

The Llama-style projections (q/k/v or Phi-3's qkv_proj, o_proj, gate/up or gate_up_proj, down_proj)
become :class:`~trtforge.llm.quant.linear.QuantLinear` modules; the embeddings, norms and LM head
stay in the model's dtype (the LM head is a tenth of an 8B model's weights and the most sensitive
projection). Every method quantizes per output channel (INT4 in groups of 128 along K within it), so
the fused path's concatenated QKV and gate/up weights are the concatenations of the quantized rows.

- ``"fp8"``: E4M3 weights with per-output-channel scales: W8A8 (activations quantized per token at
  run time) above one token, weight-only at one token (:mod:`.linear`). On CUDA it needs FP8 tensor
  cores (compute capability 8.9+: Ada, Hopper and later).
- ``"int4-rtn"``: INT4 weight-only, asymmetric (scale + offset per group of 128), round to nearest.
- ``"int4-awq"``: the same format with AWQ's activation-aware scales and clipping ranges (:mod:`.awq`),
  searched on calibration prompts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trtforge.errors import UserError
from trtforge.kernels.qweight import INT4_GROUP, quantize_fp8, quantize_int4
from trtforge.llm.models.families import LlamaStyle, adapter_for
from trtforge.llm.quant.awq import search_clip, search_scales
from trtforge.llm.quant.linear import QuantLinear

QUANTIZATIONS = ("fp8", "int4-awq", "int4-rtn")
MAX_CALIB_TOKENS = 16384  # calibration tokens used at most (prompts in order, each cut to 2048)
MAX_SEARCH_ROWS = 16384  # tokens (evenly spaced) whose Gram matrix scores each alpha
MAX_CLIP_ROWS = 16384  # and each clipping ratio


@dataclass
class QuantizationRecord:
    """What :func:`quantize_model` did: the method, which projections, their bytes before and after,
    and for AWQ the calibration tokens and each scaled group's alpha."""

    method: str
    projections: int
    bytes_before: int
    bytes_after: int
    unquantized: str = "embeddings, norms and lm_head (model dtype)"
    calib_tokens: int = 0
    alphas: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "projections": self.projections,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "unquantized": self.unquantized,
            "calib_tokens": self.calib_tokens,
            "alphas": dict(self.alphas),
        }


def model_quantization(model: nn.Module) -> str | None:
    """The method of the model's quantized projections, or None when it has none."""
    return next((m.method for m in model.modules() if isinstance(m, QuantLinear)), None)


def check_quantization(quantization: Any, where: str = "quantization") -> str | None:
    """`quantization` itself (None, or one of :data:`QUANTIZATIONS`), else a UserError."""
    if quantization is None or quantization in QUANTIZATIONS:
        return quantization
    raise UserError(
        f"{where} {quantization!r} is not supported; choose one of {', '.join(QUANTIZATIONS)} (or none)."
    )


def _groups(layer: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """The layer's projections by shared input: qkv, o, gate/up, down (names of the module attributes)."""
    a, m = layer.self_attn, layer.mlp
    qkv = [a.qkv_proj] if hasattr(a, "qkv_proj") else [a.q_proj, a.k_proj, a.v_proj]
    gate_up = [m.gate_up_proj] if hasattr(m, "gate_up_proj") else [m.gate_proj, m.up_proj]
    return [("qkv", qkv), ("o", [a.o_proj]), ("gate_up", gate_up), ("down", [m.down_proj])]


def _check_model(model: nn.Module, method: str, user: str) -> LlamaStyle:
    adapter = adapter_for(model, user)
    if not isinstance(adapter, LlamaStyle):
        raise UserError(
            f"quantization={method!r}: the {model.config.model_type} family ({type(model).__name__}) has no "
            "quantized path yet; quantization covers the Llama-style families (llama, mistral, ministral, "
            "qwen2, qwen3, phi3). Serve this model without quantization."
        )
    for i, layer in enumerate(adapter.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "down_proj") or not (hasattr(mlp, "gate_proj") or hasattr(mlp, "gate_up_proj")):
            raise UserError(
                f"quantization={method!r}: {model.config.model_type} layer {i} has no gated MLP "
                "(gate/up/down projections); the quantized path covers gated-MLP Llama-style models."
            )
        for name, mods in _groups(layer):
            for mod in mods:
                if not isinstance(mod, nn.Linear):
                    raise UserError(
                        f"quantization={method!r}: layer {i}'s {name} projection is a {type(mod).__name__}, "
                        "not an nn.Linear (already quantized?); quantize the original model once."
                    )
                k = int(mod.in_features)
                if method.startswith("int4") and k % INT4_GROUP:
                    raise UserError(
                        f"quantization={method!r}: layer {i}'s {name} projection has {k} input features, "
                        f"not a multiple of the INT4 group size {INT4_GROUP}."
                    )
    return adapter


def _check_device(model: nn.Module, method: str) -> None:
    device = next(model.parameters()).device
    if method == "fp8" and device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            name = torch.cuda.get_device_name(device)
            raise UserError(
                f"quantization='fp8' needs FP8 tensor cores (compute capability 8.9 or later: Ada, Hopper, "
                f"Blackwell); {name} has {cap[0]}.{cap[1]}. Use quantization='int4-awq' or 'int4-rtn', or "
                "no quantization."
            )
    if device.type not in ("cuda", "cpu"):
        raise UserError(f"quantization={method!r} runs on CUDA or the CPU, not on {device.type}.")


class _Stop(Exception):
    """Raised by a hook to end a calibration forward after the layer of interest."""


@torch.no_grad()
def _layer_inputs(model: nn.Module, layer: nn.Module, prompts: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each group's input ``[T, K]`` over the prompts, running the model only up to `layer`."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, mods in _groups(layer):

        def grab(_mod: Any, args: tuple, name: str = name) -> None:
            seen.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]))

        hooks.append(mods[0].register_forward_pre_hook(grab))

    def stop(*_: Any) -> None:
        raise _Stop

    hooks.append(layer.register_forward_hook(stop))
    try:
        for ids in prompts:
            with contextlib.suppress(_Stop):
                model(input_ids=ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.cat(v) for k, v in seen.items()}


def _calibration(prompts: Any, device: torch.device, vocab: int, method: str) -> list[torch.Tensor]:
    what = f"quantization={method!r} calibration prompts"
    if prompts is None or isinstance(prompts, (str, bytes)) or not len(prompts):
        raise UserError(
            f"quantization={method!r} needs calibration prompts for its activation-aware scale search: "
            "calib_prompts=[[token ids], ...] (CLI: --calib-data FILE, one prompt per line as "
            "space-separated token ids)."
        )
    out, total = [], 0
    for b, p in enumerate(prompts):
        ids = [int(t) for t in p][:2048]
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
    model: nn.Module, layer: nn.Module, index: int, prompts: list[torch.Tensor], alphas: dict
) -> dict[nn.Module, torch.Tensor]:
    """Search and fold layer `index`'s scales, then search its projections' clip ratios (returned by
    module; the caller quantizes). The model stays in float: later layers see the same inputs."""
    inputs = {k: _rows(v, MAX_SEARCH_ROWS) for k, v in _layer_inputs(model, layer, prompts).items()}
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
    model: nn.Module, method: str | None, calib_prompts: Any = None, user: str = "quantization"
) -> QuantizationRecord | None:
    """Quantize `model`'s Llama-style projections in place with `method` (None: leave it as is).

    Run it after the model is on its device and in its dtype. ``"int4-awq"`` needs `calib_prompts`
    (lists of token ids)."""
    method = check_quantization(method)
    if method is None:
        return None
    adapter = _check_model(model, method, user)
    _check_device(model, method)
    device = next(model.parameters()).device
    record = QuantizationRecord(method, 0, 0, 0)
    prompts = (
        _calibration(calib_prompts, device, int(model.config.vocab_size), method)
        if method == "int4-awq"
        else []
    )
    record.calib_tokens = sum(int(p.numel()) for p in prompts)
    was_training = model.training
    model.eval()
    clips: dict[nn.Module, torch.Tensor] = {}
    if prompts:  # every search on the float model first: each layer's inputs are the float model's
        for i, layer in enumerate(adapter.layers):
            clips.update(_awq_layer(model, layer, i, prompts, record.alphas))
    for layer in adapter.layers:
        for _, mods in _groups(layer):
            for mod in mods:
                _replace(model, mod, method, record, clips.get(mod))
    model.train(was_training)
    return record


def _replace(
    model: nn.Module, mod: nn.Linear, method: str, record: QuantizationRecord, clip: torch.Tensor | None
) -> None:
    w = mod.weight.detach()
    q = quantize_fp8(w) if method == "fp8" else quantize_int4(w, INT4_GROUP, clip)
    new = QuantLinear(q, mod.bias, method)
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is mod:
                setattr(parent, name, new)
    record.projections += 1
    record.bytes_before += mod.weight.numel() * mod.weight.element_size()
    record.bytes_after += q.nbytes
