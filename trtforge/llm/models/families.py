"""One small adapter per supported Hugging Face decoder family: what the model is, and its layer math.

An adapter reads the HF module's own submodules (linear layers, norms, MLPs, embeddings), so weights,
biases and activation choices come from the model; only the attention is rewritten around the cache.
Supported: Llama-style (llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2: GQA, RoPE, pre-norm
blocks whose norms and MLP are the model's modules (RMSNorm + SwiGLU; starcoder2's LayerNorm + GELU),
optional projection biases; qwen3's per-head q/k RMSNorm; phi3's fused qkv_proj / gate_up_proj and
partial rotary; mistral/ministral/qwen/phi3/starcoder2 sliding windows) and GPT-2 (learned positions,
LayerNorm, GELU, fused c_attn).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from trtforge.errors import UserError

LLAMA_STYLE = ("llama", "mistral", "ministral", "qwen2", "qwen3", "phi3", "starcoder2")
GPT2_STYLE = ("gpt2",)
SUPPORTED = (*LLAMA_STYLE, *GPT2_STYLE)
# families whose attention applies no sliding window or chunk, whatever the config says
_UNWINDOWED = ("llama", "gpt2")
# RoPE variants whose frequencies depend on the sequence length at run time: not a fixed table.
_DYNAMIC_ROPE = ("dynamic", "longrope")


@dataclass
class DecoderSpec:
    """What the step graph and the generation loop need to know about a model (the manifest section)."""

    family: str
    model_type: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    positions: str  # "rotary" | "learned"
    rotary: dict[str, Any] | None
    max_positions: int | None
    sliding_windows: list[int | None]
    bos_token_id: int | None
    eos_token_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _token_ids(value: Any, vocab: int) -> list[int]:
    ids = value if isinstance(value, (list, tuple)) else [value]
    return [int(i) for i in ids if i is not None and 0 <= int(i) < vocab]


def eos_token_ids(model: Any) -> list[int]:
    """Every end-of-sequence id of `model` in its vocabulary: its config's and its generation config's
    (transformers' generate() stops at the latter's; Llama 3 lists several there)."""
    config = model.config
    ids = _token_ids(config.eos_token_id, config.vocab_size)
    generation = getattr(model, "generation_config", None)
    more = _token_ids(getattr(generation, "eos_token_id", None), config.vocab_size)
    return ids + [i for i in dict.fromkeys(more) if i not in ids]


def model_type_of(model: Any, user: str = "--generate") -> str:
    """The HF `config.model_type` of `model`, or UserError naming what is supported (by `user`, the
    option or executor that asks)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model, nn.Module) or model_type is None:
        raise UserError(
            f"{user} needs a Hugging Face causal LM (a transformers PreTrainedModel with a config); got "
            f"{type(model).__name__}. Supported families: {', '.join(SUPPORTED)}."
        )
    if model_type not in SUPPORTED:
        raise UserError(
            f"model family '{model_type}' ({type(model).__name__}) is not supported by {user}. Supported "
            f"families: {', '.join(LLAMA_STYLE)} (Llama-style: RoPE, pre-norm blocks, GQA) and "
            f"{', '.join(GPT2_STYLE)} (learned positions, LayerNorm, GELU)."
        )
    if getattr(model, "lm_head", None) is None:
        raise UserError(
            f"{type(model).__name__} has no lm_head: {user} needs the causal-LM class "
            f"(e.g. {'GPT2LMHeadModel' if model_type == 'gpt2' else 'AutoModelForCausalLM'}), "
            "not the bare model."
        )
    return model_type


def refuse_unapplied_window(model: nn.Module, length: int, limit: str, user: str = "--generate") -> None:
    """UserError when a llama/gpt2 config sets a sliding window (or attention chunk) shorter than `length`
    (the `limit` option's value): their attention applies none, yet transformers' generate() cache
    truncates the keys to it, so HF's forward and generate() disagree past it."""
    c = model.config
    if c.model_type not in _UNWINDOWED:
        return
    for name in ("sliding_window", "attention_chunk_size"):
        window = getattr(c, name, None)
        if isinstance(window, int) and not isinstance(window, bool) and window < length:
            raise UserError(
                f"{c.model_type} model {type(model).__name__}: its config sets {name}={window}, shorter "
                f"than {limit} {length}. {c.model_type}'s attention applies no window, but transformers' "
                f"generate() cache truncates the keys to it, so the two disagree past {window} tokens and "
                f"{user} cannot match transformers. Pass {limit} <= {window}, or set {name} to null in "
                "config.json."
            )


class LlamaStyle:
    """Llama, Mistral, Qwen2, Qwen3 and Phi-3: pre-norm RMSNorm blocks, RoPE on q/k, GQA, gated SiLU MLP.

    Qwen3 RMS-normalizes each q and k head before RoPE (q_norm/k_norm); Phi-3 projects q, k and v with one
    fused qkv_proj (split by heads here) and gate and up with one gate_up_proj (its own MLP module runs).
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)

    def spec(self) -> DecoderSpec:
        c = self.model.config
        attn = self.layers[0].self_attn
        heads, kv_heads = int(c.num_attention_heads), int(c.num_key_value_heads or c.num_attention_heads)
        rope = self.body.rotary_emb
        rope_type = getattr(rope, "rope_type", "default")
        if rope_type in _DYNAMIC_ROPE:
            raise UserError(
                f"{c.model_type} model {type(self.model).__name__}: rotary scaling '{rope_type}' changes the "
                "frequencies with the sequence length; the step graph needs a fixed table. Supported: "
                "default, linear, llama3, yarn and other static types."
                + (
                    " The torch executor (trtforge.llm.from_pretrained) serves 'dynamic' rotary."
                    if rope_type == "dynamic"
                    else ""
                )
            )
        params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        rotary = {
            "type": rope_type,
            "theta": float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
            "dim": int(rope.inv_freq.numel() * 2),
            "attention_scaling": float(getattr(rope, "attention_scaling", 1.0)),
            "interleaved": False,
        }
        return DecoderSpec(
            family="llama",
            model_type=c.model_type,
            vocab_size=int(c.vocab_size),
            num_layers=len(self.layers),
            hidden_size=int(c.hidden_size),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(attn.head_dim),
            positions="rotary",
            rotary=rotary,
            max_positions=getattr(c, "max_position_embeddings", None),
            sliding_windows=[_window(c, i) for i in range(len(self.layers))],
            bos_token_id=next(iter(_token_ids(c.bos_token_id, c.vocab_size)), None),
            eos_token_ids=eos_token_ids(self.model),
        )

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids)

    def rotary_tables(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [B,1,S,D] exactly as the HF rotary module computes them."""
        rope = self.body.rotary_emb
        freqs = position_ids[..., None].float() * rope.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = float(getattr(rope, "attention_scaling", 1.0))
        return (emb.cos() * scaling)[:, None], (emb.sin() * scaling)[:, None]

    def qkv(self, i: int, x: Tensor, rope: Any) -> tuple[Tensor, Tensor, Tensor, float]:
        attn = self.layers[i].self_attn
        h = self.layers[i].input_layernorm(x)
        q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in project_qkv(attn, h))
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rope
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v, float(attn.scaling)

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.o_proj(attn_out)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.norm(x)


class Gpt2Style:
    """GPT-2: learned positions, pre-norm LayerNorm blocks, fused c_attn (Conv1D), GELU MLP."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.body = model.transformer
        self.layers = list(self.body.h)

    def spec(self) -> DecoderSpec:
        c = self.model.config
        attn = self.layers[0].attn
        return DecoderSpec(
            family="gpt2",
            model_type=c.model_type,
            vocab_size=int(c.vocab_size),
            num_layers=len(self.layers),
            hidden_size=int(c.hidden_size),
            num_heads=int(attn.num_heads),
            num_kv_heads=int(attn.num_heads),
            head_dim=int(attn.head_dim),
            positions="learned",
            rotary=None,
            max_positions=int(self.body.wpe.num_embeddings),
            sliding_windows=[None] * len(self.layers),
            bos_token_id=next(iter(_token_ids(c.bos_token_id, c.vocab_size)), None),
            eos_token_ids=eos_token_ids(self.model),
        )

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.wte(input_ids) + self.body.wpe(position_ids)

    def rotary_tables(self, position_ids: Tensor) -> None:
        return None

    def qkv(self, i: int, x: Tensor, rope: Any) -> tuple[Tensor, Tensor, Tensor, float]:
        attn = self.layers[i].attn
        h = self.layers[i].ln_1(x)
        q, k, v = _conv1d(attn.c_attn, h).split(attn.split_size, dim=-1)
        d = attn.head_dim
        heads = [t.unflatten(-1, (-1, d)).transpose(1, 2) for t in (q, k, v)]
        return heads[0], heads[1], heads[2], float(attn.scaling)

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + _conv1d(layer.attn.c_proj, attn_out)
        mlp = layer.mlp
        return x + _conv1d(mlp.c_proj, mlp.act(_conv1d(mlp.c_fc, layer.ln_2(x))))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.ln_f(x)


def project_qkv(attn: nn.Module, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [..., heads * head_dim] of a Llama-style attention module: its three projections, or
    Phi-3's fused qkv_proj split by heads (q heads, then the key heads, then the value heads)."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    q_size = int(attn.config.num_attention_heads) * attn.head_dim
    kv_size = int(attn.config.num_key_value_heads or attn.config.num_attention_heads) * attn.head_dim
    return fused(h).split([q_size, kv_size, kv_size], dim=-1)


def _conv1d(module: nn.Module, x: Tensor) -> Tensor:
    """GPT-2's Conv1D (a linear layer with a [in, out] weight) without its view to a traced shape, which
    the legacy exporter would freeze to the example's sequence length."""
    return torch.matmul(x, module.weight) + module.bias


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's non-interleaved rotary embedding: x*cos + rotate_half(x)*sin over the first `dim` channels."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    out = rot * cos + rotated * sin
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


def _window(config: Any, layer: int) -> int | None:
    """The sliding-attention window of one layer (None: full attention), as transformers decides it."""
    window = getattr(config, "sliding_window", None)
    if not window or config.model_type in _UNWINDOWED:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        return int(window) if types[layer] == "sliding_attention" else None
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return int(window)


def adapter_for(model: Any) -> LlamaStyle | Gpt2Style:
    """The adapter for `model`'s family (UserError listing the supported families otherwise)."""
    model_type = model_type_of(model)
    return Gpt2Style(model) if model_type in GPT2_STYLE else LlamaStyle(model)
