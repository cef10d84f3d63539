"""Tensor parallelism (Megatron-style) over a family adapter's modules, for one rank of a group.

A rank keeps its slice of each projection and the model stays an ordinary transformers model:

- column-parallel: q/k/v (its heads and KV heads, in the projections' layout: three separate ones, a fused
  ``[q | k | v]`` (Phi-3's ``qkv_proj``, MPT's ``Wqkv``, GPT-2's ``c_attn`` made Linear), or the per-head
  ``[heads, 3, D]`` ``query_key_value`` of GPT-NeoX, Persimmon, BLOOM and Falcon's MHA forms, or Falcon-40b's
  grouped ``[kv_heads, heads / kv_heads + 2, D]``: whole KV groups) and the MLP's input projections (gate/up,
  up alone, fc1, c_fc, dense_h_to_4h, or a fused ``[gate | up]`` ``gate_up_proj``) keep their rows;
- row-parallel: the attention's output projection (o_proj, dense, out_proj, c_proj) and the MLP's (down_proj,
  fc2, c_proj, dense_4h_to_h) keep their input columns and become :class:`RowParallelLinear`, whose forward
  sums the ranks' partial products with one all-reduce and adds the bias once, after it (inside
  :func:`partial_sums` it returns this rank's partial product instead, the bias on rank 0 alone: a
  parallel-residual block sums its attention's and its MLP's with one all-reduce, not two);
- per-head q/k norms keep their heads' weights (or are shared by all heads as they are); an RMSNorm over a
  whole q or k projection (OLMo 2's) becomes :class:`ShardedRMSNorm`, exact with one all-reduce;
- ALiBi slopes: each rank its heads' (the adapter's, :meth:`~.base.DecoderAdapter.shard`);
- the embedding stays whole on every rank (a lookup reads only its rows); the LM head is vocab-parallel
  (:class:`VocabParallelHead`: each rank its ``ceil(V / world)`` rows, zero-padded, then one all-gather),
  so every rank ends a step with the full logits and rank 0's are the ones sampled.

:func:`shard_attention` and :func:`shard_mlp` are what every adapter's ``shard`` calls
(:meth:`~trtforge.llm.models.base.DecoderAdapter.check_shard` says which models they fit).

The collectives are ``torch.distributed``'s on the group's backend: gloo on CPUs, NCCL on GPUs (whose
all-reduce and all-gather CUDA graphs capture).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trtforge.errors import UserError


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group: `rank` of `world`, collectives on `group`
    (None: torch.distributed's default group)."""

    rank: int
    world: int
    group: Any = None

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks, in place."""
        import torch.distributed as dist

        dist.all_reduce(t, group=self.group)
        return t

    def gather_columns(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """Every rank's ``[N, S]`` slice side by side, cut to `width` columns: ``[N, width]``."""
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)[..., :width]

    def share(self, n: int) -> tuple[int, int]:
        """This rank's [start, stop) of `n` items split evenly (n divisible by the world)."""
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per


def check_divisible(what: str, counts: dict[str, int], world: int) -> None:
    """UserError naming the first count that `world` ranks cannot split evenly."""
    for name, n in counts.items():
        if n % world:
            sizes = [str(d) for d in range(2, n + 1) if n % d == 0]
            choice = (
                f"Choose a tensor_parallel_size that divides {n} (e.g. {', '.join(sizes)})."
                if sizes
                else f"With {n} {name}, only tensor_parallel_size=1 splits it."
            )
            raise UserError(
                f"tensor_parallel_size {world} does not divide {what}'s {name} ({n}): each rank must hold "
                f"an equal share of the {name}. {choice}"
            )


def keep_rows(linear: nn.Linear, start: int, stop: int) -> None:
    """Column parallelism: `linear` keeps output rows [start, stop) (and their bias)."""
    keep_ranges(linear, [(start, stop)])


_PARTIAL = threading.local()  # per thread: the ranks of one process (tests) each run on their own


@contextlib.contextmanager
def partial_sums() -> Iterator[None]:
    """Inside, every :class:`RowParallelLinear` returns this rank's partial product (its bias on rank 0
    alone) without its all-reduce: the caller adds such outputs and reduces their sum once."""
    before = getattr(_PARTIAL, "on", False)
    _PARTIAL.on = True
    try:
        yield
    finally:
        _PARTIAL.on = before


class RowParallelLinear(nn.Linear):
    """A linear layer holding input columns [start, stop) of `linear`: partial products summed over the
    ranks by one all-reduce, the bias added once after it."""

    def __init__(self, linear: nn.Linear, tp: TensorParallel, start: int, stop: int) -> None:
        nn.Module.__init__(self)
        self.tp = tp
        self.in_features, self.out_features = stop - start, linear.out_features
        self.weight = nn.Parameter(linear.weight.data[:, start:stop].clone(), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight)
        if getattr(_PARTIAL, "on", False):
            return y if self.bias is None or self.tp.rank != 0 else y + self.bias
        y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias


class VocabParallelHead(nn.Module):
    """The LM head's rows of this rank (``ceil(V / world)`` of them, the last rank's zero-padded): logits
    of its share, all-gathered into the full ``[..., V]`` on every rank. ``weight``/``bias`` are the
    padded share (the fused path multiplies by them and gathers with :meth:`gather`)."""

    def __init__(self, head: nn.Linear, tp: TensorParallel) -> None:
        super().__init__()
        self.tp, self.vocab = tp, int(head.weight.shape[0])
        per = -(-self.vocab // tp.world)
        start, stop = tp.rank * per, min((tp.rank + 1) * per, self.vocab)
        w = head.weight.data
        weight = torch.zeros((per, w.shape[1]), dtype=w.dtype, device=w.device)
        weight[: max(stop - start, 0)] = w[start:stop]
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None
        if head.bias is not None:
            bias = torch.zeros(per, dtype=head.bias.dtype, device=head.bias.device)
            bias[: max(stop - start, 0)] = head.bias.data[start:stop]
            self.bias = nn.Parameter(bias, requires_grad=False)

    def gather(self, partial: torch.Tensor) -> torch.Tensor:
        """Every rank's ``[..., V / world]`` logits as the full ``[..., V]``."""
        return self.tp.gather_columns(partial, self.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gather(nn.functional.linear(x, self.weight, self.bias))


def keep_ranges(linear: nn.Linear, ranges: list[tuple[int, int]]) -> None:
    """Column parallelism over a fused projection: `linear` keeps the output rows of each [start, stop) in
    `ranges`, concatenated in that order (and their bias)."""
    w, b = linear.weight.data, linear.bias
    linear.weight = nn.Parameter(torch.cat([w[s:e] for s, e in ranges]).clone(), requires_grad=False)
    if b is not None:
        linear.bias = nn.Parameter(torch.cat([b.data[s:e] for s, e in ranges]).clone(), requires_grad=False)
    linear.out_features = sum(e - s for s, e in ranges)


def fused_qkv_ranges(tp: TensorParallel, heads: int, kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
    """This rank's rows of a projection laid out ``[q | k | v]`` by heads (Phi-3's ``qkv_proj``, MPT's
    ``Wqkv``): its query heads, its key heads, its value heads."""
    d, (q0, q1), (k0, k1) = head_dim, tp.share(heads), tp.share(kv_heads)
    k_at, v_at = heads * d, (heads + kv_heads) * d
    return [(q0 * d, q1 * d), (k_at + k0 * d, k_at + k1 * d), (v_at + k0 * d, v_at + k1 * d)]


def per_head_qkv_ranges(tp: TensorParallel, heads: int, head_dim: int) -> list[tuple[int, int]]:
    """This rank's rows of a projection laid out ``[heads, 3, D]`` (GPT-NeoX's, Persimmon's and BLOOM's
    ``query_key_value``: each head's q, k, v side by side): its heads' blocks, one contiguous range."""
    h0, h1 = tp.share(heads)
    return [(h0 * 3 * head_dim, h1 * 3 * head_dim)]


def grouped_qkv_ranges(tp: TensorParallel, heads: int, kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
    """This rank's rows of a projection laid out ``[kv_heads, heads / kv_heads + 2, D]`` (Falcon-40b/180b's
    ``query_key_value``: each KV group's queries, then its key and value): its whole groups, one range."""
    g0, g1 = tp.share(kv_heads)
    width = (heads // kv_heads + 2) * head_dim
    return [(g0 * width, g1 * width)]


def gate_up_ranges(tp: TensorParallel, width: int) -> list[tuple[int, int]]:
    """This rank's rows of a fused ``[gate | up]`` projection of an MLP `width` wide (Phi-3's and GLM's
    ``gate_up_proj``): its share of the gate, then the same share of up."""
    i0, i1 = tp.share(width)
    return [(i0, i1), (width + i0, width + i1)]


# an attention module's projections: the layouts of q/k/v and the names of its output projection
_ATTENTION_OUT = ("o_proj", "dense", "out_proj", "c_proj")
# the fused [q | k | v] projections (Phi-3's, MPT's, GPT-2's made Linear)
_FUSED_QKV = ("qkv_proj", "Wqkv", "c_attn")
# the per-head [heads, 3, D] projections (GPT-NeoX's, BLOOM's, Falcon's; GPT-BigCode's multi-head c_attn,
# which its adapter names "per_head")
_PER_HEAD_QKV = ("query_key_value", "c_attn")
# an MLP's column-parallel projections (in its forward's order) and its row-parallel one; the fused
# gate_up_proj is apart (gate_up_ranges)
_MLP_LAYOUTS = (
    (("gate_proj", "up_proj"), "down_proj"),
    (("up_proj",), "down_proj"),
    (("fc1",), "fc2"),
    (("c_fc",), "c_proj"),
    (("dense_h_to_4h",), "dense_4h_to_h"),
)
# the per-head q/k norm modules a family's attention may hold, the q's and the k's
_Q_NORMS = ("q_norm", "q_layernorm", "query_layernorm")
_K_NORMS = ("k_norm", "k_layernorm", "key_layernorm")
# RMSNorms over a whole q or k projection split exactly by ShardedRMSNorm (their math is its math)
_WHOLE_WIDTH_RMS = ("Olmo2RMSNorm", "Olmo3RMSNorm")
# weightless RMSNorms their attention applies to each head's channels (NanoChat's q/k norms): nothing to split
_WEIGHTLESS_HEAD_RMS = ("NanoChatRMSNorm",)


def attention_layout(attn: nn.Module) -> str | None:
    """How `attn` projects q/k/v: "separate" (q_proj, k_proj, v_proj), "fused" (``qkv_proj``, MPT's
    ``Wqkv``: [q | k | v]), "per_head" (``query_key_value``: [heads, 3, D]); None for anything else (or no
    output projection)."""
    if not any(isinstance(getattr(attn, n, None), nn.Linear) for n in _ATTENTION_OUT):
        return None
    if all(isinstance(getattr(attn, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj")):
        return "separate"
    if any(isinstance(getattr(attn, n, None), nn.Linear) for n in _FUSED_QKV):
        return "fused"
    if isinstance(getattr(attn, "query_key_value", None), nn.Linear):
        return "per_head"
    return None


def mlp_width(mlp: nn.Module) -> int | None:
    """The hidden width of `mlp` that its projections split (None: a layout :func:`shard_mlp` does not
    know)."""
    fused = getattr(mlp, "gate_up_proj", None)
    if isinstance(fused, nn.Linear) and isinstance(getattr(mlp, "down_proj", None), nn.Linear):
        return int(fused.weight.shape[0]) // 2
    for columns, row in _MLP_LAYOUTS:
        if all(isinstance(getattr(mlp, n, None), nn.Linear) for n in (*columns, row)):
            return int(getattr(mlp, columns[0]).weight.shape[0])
    return None


def head_norm_refusal(attn: nn.Module, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """Why the q/k norms of `attn` cannot be split by heads (None: they can, or there are none): a norm is
    split when it is one head's (shared by all: ``[D]``), one a head (``[heads, D]``, or a list of per-head
    norms), a weightless one applied per head (:data:`_WEIGHTLESS_HEAD_RMS`), or one of
    :data:`_WHOLE_WIDTH_RMS` over the whole projection (an exact all-reduce of its sum of squares); any other
    norm over the whole projection couples the ranks."""
    for names, n in ((_Q_NORMS, heads), (_K_NORMS, kv_heads)):
        for name in names:
            norm = getattr(attn, name, None)
            if not isinstance(norm, nn.Module):
                continue
            per_head = getattr(norm, "norms", None)
            if isinstance(per_head, nn.ModuleList):
                if len(per_head) != n:
                    return f"{name} holds {len(per_head)} per-head norms for {n} heads"
                continue
            weight = getattr(norm, "weight", None)
            shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
            if shape in ((head_dim,), (n, head_dim)):
                continue
            if shape is None and type(norm).__name__ in _WEIGHTLESS_HEAD_RMS:
                continue
            if shape == (n * head_dim,) and type(norm).__name__ in _WHOLE_WIDTH_RMS:
                continue
            return (
                f"{name} ({type(norm).__name__}, weight {shape}) normalizes over its whole projection "
                f"({n} heads x {head_dim}), which couples the ranks' heads"
            )
    return None


class ShardedRMSNorm(nn.Module):
    """An RMSNorm over a whole projection (OLMo 2's q/k norm) whose channels are split over the ranks: each
    rank's sum of squares all-reduced into the whole width's mean square (one all-reduce), this rank's
    slice of the weight; the math of transformers' ``Olmo2RMSNorm`` (float32, weight times the normed
    input, cast back)."""

    def __init__(self, norm: nn.Module, tp: TensorParallel, start: int, stop: int) -> None:
        super().__init__()
        self.tp, self.width, self.eps = tp, int(norm.weight.shape[0]), float(norm.variance_epsilon)
        self.weight = nn.Parameter(norm.weight.data[start:stop].clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, x = x.dtype, x.to(torch.float32)
        square = self.tp.all_reduce(x.pow(2).sum(-1, keepdim=True)) / self.width
        return (self.weight * (x * torch.rsqrt(square + self.eps))).to(dtype)


def shard_attention(
    attn: nn.Module, tp: TensorParallel, heads: int, kv_heads: int, head_dim: int, layout: str | None = None
) -> None:
    """Rank ``tp.rank``'s share of `attn` (:func:`attention_layout` not None, :func:`head_norm_refusal`
    None): its heads' rows of q/k/v in their layout (`layout`, else :func:`attention_layout`'s; "grouped":
    Falcon-40b's ``query_key_value``), the output projection row-parallel over its heads' columns, its
    heads of each per-head q/k norm, its channels of a whole-projection RMSNorm."""
    d, (q0, q1), (k0, k1) = head_dim, tp.share(heads), tp.share(kv_heads)
    layout = layout or attention_layout(attn)
    if layout == "separate":
        keep_rows(attn.q_proj, q0 * d, q1 * d)
        keep_rows(attn.k_proj, k0 * d, k1 * d)
        keep_rows(attn.v_proj, k0 * d, k1 * d)
    elif layout == "fused":
        fused = next(getattr(attn, n) for n in _FUSED_QKV if isinstance(getattr(attn, n, None), nn.Linear))
        keep_ranges(fused, fused_qkv_ranges(tp, heads, kv_heads, d))
    elif layout == "per_head":  # (GPT-BigCode's multi-head c_attn too)
        fused = next(getattr(attn, n) for n in _PER_HEAD_QKV if isinstance(getattr(attn, n, None), nn.Linear))
        keep_ranges(fused, per_head_qkv_ranges(tp, heads, d))
    elif layout == "grouped":
        keep_ranges(attn.query_key_value, grouped_qkv_ranges(tp, heads, kv_heads, d))
    else:
        raise ValueError(f"no q/k/v layout to split in {type(attn).__name__}")
    out = next(n for n in _ATTENTION_OUT if isinstance(getattr(attn, n, None), nn.Linear))
    setattr(attn, out, RowParallelLinear(getattr(attn, out), tp, q0 * d, q1 * d))
    for names, n, (h0, h1) in ((_Q_NORMS, heads, (q0, q1)), (_K_NORMS, kv_heads, (k0, k1))):
        for name in names:
            norm = getattr(attn, name, None)
            if not isinstance(norm, nn.Module):
                continue
            if isinstance(getattr(norm, "norms", None), nn.ModuleList):  # StableLM: a norm a head
                norm.norms = nn.ModuleList(list(norm.norms)[h0:h1])
            elif getattr(norm, "weight", None) is None:  # NanoChat: weightless, each head's alike
                continue
            elif tuple(norm.weight.shape) == (n, d):  # Cohere: a weight row a head
                norm.weight = nn.Parameter(norm.weight.data[h0:h1].clone(), requires_grad=False)
            elif tuple(norm.weight.shape) == (n * d,) and n * d != d:  # OLMo 2: the whole projection
                setattr(attn, name, ShardedRMSNorm(norm, tp, h0 * d, h1 * d))


def shard_mlp(mlp: nn.Module, tp: TensorParallel) -> None:
    """Rank ``tp.rank``'s share of a dense `mlp` (:func:`mlp_width` not None): its rows of the
    column-parallel projections (gate/up, up alone, fc1, c_fc, dense_h_to_4h; the fused gate_up_proj by
    :func:`gate_up_ranges`), the matching columns of the row-parallel one."""
    width = mlp_width(mlp)
    if width is None:
        raise ValueError(f"no MLP layout to split in {type(mlp).__name__}")
    i0, i1 = tp.share(width)
    if isinstance(getattr(mlp, "gate_up_proj", None), nn.Linear):
        keep_ranges(mlp.gate_up_proj, gate_up_ranges(tp, width))
        mlp.down_proj = RowParallelLinear(mlp.down_proj, tp, i0, i1)
        return
    for columns, row in _MLP_LAYOUTS:
        if all(isinstance(getattr(mlp, n, None), nn.Linear) for n in (*columns, row)):
            for name in columns:
                keep_rows(getattr(mlp, name), i0, i1)
            setattr(mlp, row, RowParallelLinear(getattr(mlp, row), tp, i0, i1))
            return


def sharded(model: nn.Module) -> TensorParallel | None:
    """The group `model` was sharded for (None: whole)."""
    return getattr(model, "_trtforge_tensor_parallel", None)


def mark_sharded(model: nn.Module, tp: TensorParallel) -> None:
    model._trtforge_tensor_parallel = tp  # type: ignore[assignment]
