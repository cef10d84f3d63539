"""The GPT-2 adapter (learned positions, pre-norm LayerNorm blocks, fused c_attn (Conv1D), GELU MLP,
multi-head attention, no window), GPT-SW3 (GPT-2's model under a model type of its own) and its relatives
that differ only in the attention's projections, scale and windows: GPT-Neo and GPT-BigCode; and GPT-1
(openai-gpt), GPT-2's layers in post-norm blocks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models import parallel
from trtforge.llm.models.base import TP_RULE, DecoderAdapter, DecoderSpec


class Gpt2Style(DecoderAdapter):
    """GPT-2 (``GPT2LMHeadModel``). Tensor parallelism turns its Conv1D projections into the equivalent
    ``nn.Linear`` layers first (:meth:`_shard_weights`), then splits c_attn as ``[q | k | v]``."""

    family = "gpt2"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.transformer.h), user)
        self.body = model.transformer
        attn = self._attention(0)
        self.num_heads = int(attn.num_heads)
        self.num_kv_heads = int(getattr(attn, "kv_heads", attn.num_heads))  # (GPT-BigCode's multi-query: 1)
        self.head_dim = int(attn.head_dim)
        # the module's own scale: GPT-2's 1/sqrt(D) if scale_attn_weights, / (layer + 1) if by inverse
        # layer idx; GPT-Neo's attention has none (its scores are unscaled)
        self.scales = [float(getattr(self._attention(i), "scaling", 1.0)) for i in range(self.num_layers)]
        self._count_rank_heads()

    def attention(self, i: int) -> nn.Module:
        return self._attention(i)

    def _conv1d(self) -> bool:
        """Whether the layers hold transformers' Conv1D (GPT-2's; GPT-Neo's and GPT-BigCode's are Linear)."""
        return is_conv1d(self.layers[0].mlp.c_fc)

    def attention_layout(self, i: int) -> str | None:
        """GPT-2's c_attn is ``[q | k | v]`` by heads ("fused"; a Conv1D until :meth:`_shard_weights`);
        the others' as their module's names tell."""
        return "fused" if self._conv1d() else super().attention_layout(i)

    def check_shard(self, world: int) -> None:
        """GPT-2's heads and MLP width must divide over `world` ranks (UserError; its Conv1D layers are
        Linear's equivalent, :meth:`_shard_weights`); the others: the base class's checks."""
        if not self._conv1d():
            super().check_shard(world)
            return
        counts = {
            "attention heads (n_head)": self.num_heads,
            "MLP width (n_inner)": int(self.layers[0].mlp.c_fc.nf),
        }
        parallel.check_divisible(f"gpt2 model {type(self.model).__name__}", counts, world)

    def _shard_weights(self, tp: object) -> None:
        """Each layer's Conv1D c_attn, c_proj, c_fc and c_proj as the ``nn.Linear`` it equals (its
        ``[in, out]`` weight transposed), then the base class's split."""
        for layer in self.layers if self._conv1d() else []:
            for module, names in ((layer.attn, ("c_attn", "c_proj")), (layer.mlp, ("c_fc", "c_proj"))):
                for name in names:
                    if is_conv1d(getattr(module, name)):
                        setattr(module, name, as_linear(getattr(module, name)))
        super()._shard_weights(tp)

    def _attention(self, i: int) -> nn.Module:
        """Layer i's attention module (the one holding the projections and the head counts)."""
        return self.layers[i].attn

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(positions="learned", rotary=None, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        return int(self.body.wpe.num_embeddings)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.wte(input_ids) + self.body.wpe(position_ids)

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> None:
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].attn
        q, k, v = conv1d(attn.c_attn, self.layers[i].ln_1(x)).chunk(3, dim=-1)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + conv1d(layer.attn.c_proj, attn_out)
        mlp = layer.mlp
        return x + conv1d(mlp.c_proj, mlp.act(conv1d(mlp.c_fc, layer.ln_2(x))))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.ln_f(x)


def is_conv1d(module: nn.Module) -> bool:
    """Whether `module` is transformers' Conv1D (an ``[in, out]`` weight), not an ``nn.Linear``."""
    return type(module).__name__ == "Conv1D"


def as_linear(conv: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` equal to GPT-2's Conv1D `conv` (its ``[in, out]`` weight transposed, its bias)."""
    w = conv.weight.data
    linear = nn.Linear(w.shape[0], w.shape[1], bias=conv.bias is not None, device=w.device, dtype=w.dtype)
    linear.weight = nn.Parameter(w.t().contiguous(), requires_grad=False)
    if conv.bias is not None:
        linear.bias = nn.Parameter(conv.bias.data.clone(), requires_grad=False)
    return linear


def conv1d(module: nn.Module, x: Tensor) -> Tensor:
    """GPT-2's Conv1D (a linear layer with an [in, out] weight). Flat tokens ``[T, in]`` (the torch
    executor) and a Conv1D made ``nn.Linear`` (tensor parallelism) run the module itself, as HF does;
    batched ``[B, S, in]`` (the step graph) run without its view to a traced shape, which the legacy
    exporter would freeze to the example's length."""
    if x.dim() == 2 or isinstance(module, nn.Linear):
        return module(x)
    return torch.matmul(x, module.weight) + module.bias


class GptSw3Style(Gpt2Style):
    """GPT-SW3 (AI Sweden's gpt-sw3: ``GPT2LMHeadModel`` under ``model_type`` "gpt-sw3", which transformers
    maps to GPT-2's config and model): GPT-2 as it is."""

    family = "gpt-sw3"


class GptNeoStyle(Gpt2Style):
    """GPT-Neo (``GPTNeoForCausalLM``): GPT-2's embeddings, blocks and head with separate unbiased q/k/v
    projections, attention scores left unscaled (as EleutherAI trained it), and the "local" layers of
    ``config.attention_layers`` attending to the last ``window_size`` keys
    (:func:`~trtforge.llm.models.base.sliding_windows`)."""

    family = "gpt_neo"

    def _attention(self, i: int) -> nn.Module:
        return self.layers[i].attn.attention

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self._attention(i)
        h = self.layers[i].ln_1(x)
        return tuple(p(h).unflatten(-1, (-1, self.head_dim)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + self._attention(i).out_proj(attn_out)
        return x + layer.mlp(layer.ln_2(x))


class GptBigCodeStyle(Gpt2Style):
    """GPT-BigCode (``GPTBigCodeForCausalLM``: StarCoder 1, SantaCoder): GPT-2's embeddings, blocks and head
    with a linear c_attn that yields one key/value head after the queries (``multi_query``), or per head
    [q, k, v] otherwise."""

    family = "gpt_bigcode"

    def attention_layout(self, i: int) -> str | None:
        """The multi-head c_attn is ``[heads, 3, D]`` ("per_head"); the multi-query one is not split."""
        return "per_head" if not self.layers[i].attn.multi_query else None

    def check_shard(self, world: int) -> None:
        """The multi-query form (StarCoder, SantaCoder) is refused (UserError: its one KV head cannot be
        split); the multi-head form splits whole heads (the base class's checks)."""
        if self.layers[0].attn.multi_query:
            raise UserError(
                f"tensor parallelism is not supported for gpt_bigcode models ({type(self.model).__name__}) "
                f"in their multi-query form (multi_query: StarCoder, SantaCoder): {TP_RULE} c_attn yields "
                "one key/value head after the queries, which cannot be split over the ranks. Use "
                "tensor_parallel_size=1."
            )
        super().check_shard(world)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].attn
        y = attn.c_attn(self.layers[i].ln_1(x))
        d = self.head_dim
        if attn.multi_query:
            q, k, v = y.split((attn.embed_dim, attn.kv_dim, attn.kv_dim), dim=-1)
            return q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)), v.unflatten(-1, (-1, d))
        q, k, v = y.unflatten(-1, (self.num_heads, 3 * d)).split(d, dim=-1)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.attn.c_proj(attn_out)
        return x + layer.mlp(layer.ln_2(x))


class OpenAIGptStyle(Gpt2Style):
    """GPT-1 (``OpenAIGPTLMHeadModel``, ``model_type`` "openai-gpt"): GPT-2's Conv1D layers and learned
    positions in post-norm blocks: ``n = ln_1(x + attn(x))``, then ``ln_2(n + mlp(n))``, each layer's input
    already normed (no final norm; scores scaled by 1/sqrt(D); masked by -1e4, which leaves a masked key no
    weight at any score the model reaches). Tensor parallelism is refused (:attr:`tp_refusal`)."""

    family = "openai-gpt"
    tp_refusal = "post-norm blocks (a LayerNorm after each residual add) have no split yet."

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        DecoderAdapter.__init__(self, model, list(model.transformer.h), user)
        self.body = model.transformer
        attn = self.layers[0].attn
        self.num_heads = self.num_kv_heads = int(attn.n_head)
        self.head_dim = int(attn.split_size) // self.num_heads
        self.scales = [self.head_dim**-0.5 if layer.attn.scale else 1.0 for layer in self.layers]
        self._count_rank_heads()

    def check_shard(self, world: int) -> None:
        DecoderAdapter.check_shard(self, world)  # (tp_refusal)

    @property
    def max_length(self) -> int:
        return int(self.body.positions_embed.num_embeddings)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.tokens_embed(input_ids) + self.body.positions_embed(position_ids)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = conv1d(self.layers[i].attn.c_attn, x).chunk(3, dim=-1)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        n = layer.ln_1(x + conv1d(layer.attn.c_proj, attn_out))
        mlp = layer.mlp
        return layer.ln_2(n + conv1d(mlp.c_proj, mlp.act(conv1d(mlp.c_fc, n))))

    def final_norm(self, x: Tensor) -> Tensor:
        return x
