"""Tensor parallelism (Megatron-style) over a family adapter's modules, for one rank of a group.

A rank keeps its slice of each projection and the model stays an ordinary transformers model:

- column-parallel: q/k/v (its heads and KV heads) and gate/up (starcoder2: c_fc) keep their rows;
- row-parallel: o_proj and down_proj (starcoder2: c_proj) keep their input columns and become
  :class:`RowParallelLinear`, whose forward sums the ranks' partial products with one all-reduce and adds
  the bias once, after it;
- the embedding stays whole on every rank (a lookup reads only its rows); the LM head is vocab-parallel
  (:class:`VocabParallelHead`: each rank its ``ceil(V / world)`` rows, zero-padded, then one all-gather),
  so every rank ends a step with the full logits and rank 0's are the ones sampled.

The collectives are ``torch.distributed``'s on the group's backend: gloo on CPUs, NCCL on GPUs (whose
all-reduce and all-gather CUDA graphs capture).
"""

from __future__ import annotations

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
            raise UserError(
                f"tensor_parallel_size {world} does not divide {what}'s {name} ({n}): each rank must hold "
                f"an equal share of the {name}. Choose a tensor_parallel_size that divides {n} "
                f"(e.g. {', '.join(str(d) for d in range(1, n + 1) if n % d == 0 and d > 1)})."
            )


def keep_rows(linear: nn.Linear, start: int, stop: int) -> None:
    """Column parallelism: `linear` keeps output rows [start, stop) (and their bias)."""
    linear.weight = nn.Parameter(linear.weight.data[start:stop].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[start:stop].clone(), requires_grad=False)
    linear.out_features = stop - start


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
        y = self.tp.all_reduce(nn.functional.linear(x, self.weight))
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


def sharded(model: nn.Module) -> TensorParallel | None:
    """The group `model` was sharded for (None: whole)."""
    return getattr(model, "_trtforge_tensor_parallel", None)


def mark_sharded(model: nn.Module, tp: TensorParallel) -> None:
    model._trtforge_tensor_parallel = tp  # type: ignore[assignment]
