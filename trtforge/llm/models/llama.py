"""The Llama-style adapter: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2, internlm3, seed_oss,
arcee.

GQA, RoPE on q/k, pre-norm blocks whose norms and MLP are the model's own modules (RMSNorm + gated
SiLU; starcoder2's LayerNorm + GELU; arcee's non-gated squared ReLU), optional projection biases (Seed-OSS:
q/k/v and output biases set apart); qwen3's per-head q/k RMSNorm before
RoPE; phi3's fused qkv_proj / gate_up_proj and partial rotary; the sliding windows of
:func:`~trtforge.llm.models.base.sliding_windows`. The body, rotary and pre-norm block are
:class:`~trtforge.llm.models.rope.RopeStyle`'s; this adds the q/k head norms and tensor parallelism.
Only this class's models run the fused CUDA layers and quantization, which assume its exact math.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models import parallel
from trtforge.llm.models.rope import RopeStyle


class LlamaStyle(RopeStyle):
    """Llama and its relatives (see the module docstring)."""

    family = "llama"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        done = parallel.sharded(model)
        if done is not None:  # one rank's shard already: this rank's heads
            self.num_heads //= done.world
            self.num_kv_heads //= done.world

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    def shard(self, tp: Any) -> None:
        """Rank ``tp.rank``'s share (:mod:`.parallel`): its query and KV heads of q/k/v, its rows of
        gate/up (c_fc; arcee's up alone), the matching columns of o_proj and down_proj (c_proj) made
        row-parallel, a vocab-parallel LM head. UserError when `tp.world` does not divide the heads, the KV
        heads or the MLP width. In place, once per model: the shard is marked on the model, and every
        adapter made of it later counts this rank's heads from that mark (sharding it again for `tp` does
        nothing)."""
        done = parallel.sharded(self.model)
        if done is not None:
            if (done.rank, done.world) != (tp.rank, tp.world):
                raise ValueError(f"model already sharded as rank {done.rank} of {done.world}")
            return
        self._shard_weights(tp)
        parallel.mark_sharded(self.model, tp)
        self.num_heads //= tp.world
        self.num_kv_heads //= tp.world

    def _shard_weights(self, tp: Any) -> None:
        c, world = self.config, tp.world
        if any(getattr(layer.self_attn, "qkv_proj", None) is not None for layer in self.layers) or any(
            getattr(layer.mlp, "gate_up_proj", None) is not None for layer in self.layers
        ):
            raise UserError(
                f"tensor parallelism does not split {c.model_type}'s fused qkv_proj / gate_up_proj "
                f"({type(self.model).__name__}); supported: llama, mistral, ministral, qwen2, qwen3, "
                "starcoder2, internlm3, seed_oss, arcee. Use tensor_parallel_size=1."
            )
        mlp0 = self.layers[0].mlp
        up0 = getattr(mlp0, "up_proj", None) or mlp0.c_fc
        name = type(self.model).__name__
        parallel.check_divisible(
            f"{c.model_type} model {name}",
            {
                "attention heads (num_attention_heads)": self.num_heads,
                "KV heads (num_key_value_heads)": self.num_kv_heads,
                "MLP width (intermediate_size)": int(up0.weight.shape[0]),
            },
            world,
        )
        d = self.head_dim
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            q0, q1 = tp.share(self.num_heads)
            k0, k1 = tp.share(self.num_kv_heads)
            parallel.keep_rows(a.q_proj, q0 * d, q1 * d)
            parallel.keep_rows(a.k_proj, k0 * d, k1 * d)
            parallel.keep_rows(a.v_proj, k0 * d, k1 * d)
            a.o_proj = parallel.RowParallelLinear(a.o_proj, tp, q0 * d, q1 * d)
            if hasattr(m, "up_proj"):  # gated (gate_proj, up_proj) or not (arcee: up_proj alone)
                i0, i1 = tp.share(int(m.up_proj.weight.shape[0]))
                if hasattr(m, "gate_proj"):
                    parallel.keep_rows(m.gate_proj, i0, i1)
                parallel.keep_rows(m.up_proj, i0, i1)
                m.down_proj = parallel.RowParallelLinear(m.down_proj, tp, i0, i1)
            else:  # starcoder2: c_fc -> GELU -> c_proj
                i0, i1 = tp.share(int(m.c_fc.weight.shape[0]))
                parallel.keep_rows(m.c_fc, i0, i1)
                m.c_proj = parallel.RowParallelLinear(m.c_proj, tp, i0, i1)
        self.model.lm_head = parallel.VocabParallelHead(self.model.lm_head, tp)
