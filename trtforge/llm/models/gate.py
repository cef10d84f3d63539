"""The attention output gate: each head's attention output times an activation of a projection of the
attention's input, before ``o_proj`` (MiniCPM5-MoE, AFMoE, Beam; Laguna's and Qwen3-Next's too, refused
for other reasons). One description (:class:`OutputGate`) that an adapter sets as its
:attr:`~trtforge.llm.models.base.DecoderAdapter.output_gate`, and one computation of it
(:meth:`OutputGate.apply`), which every attention consumer runs through
:meth:`~trtforge.llm.models.base.DecoderAdapter.gated` (the torch executor's layers, the step graph) and
the paths without it refuse by name (the fused CUDA layers, tensor parallelism).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: the gate activations, as transformers' modeling files apply them
ACTIVATIONS = {"sigmoid": torch.sigmoid, "softplus": F.softplus}


@dataclass(frozen=True)
class OutputGate:
    """How a family gates its attention output ``[..., heads * D]``: times ``act(proj(h) [+ bias])`` of
    the attention input `h`, elementwise (one gate a channel) or one gate a head broadcast over its D
    channels."""

    #: the attention module's projection of the gate: ``gate_proj`` (AFMoE, Beam), ``q_gate_proj``
    #: (MiniCPM5-MoE: the gate is the second half of each head's rows), ``g_proj`` (Laguna)
    projection: str
    #: "sigmoid" or "softplus" (:data:`ACTIVATIONS`)
    activation: str = "sigmoid"
    #: one gate a head (the projection ``[..., heads]``), not one a channel (``[..., heads * D]``)
    per_head: bool = False
    #: the attention module's parameter of one bias a head, added before the activation (Beam's
    #: ``gate_bias``); None: none
    bias: str | None = None
    #: the projection lays each head's rows out as [query | gate] (MiniCPM5-MoE's ``q_gate_proj``)
    with_query: bool = False
    #: the activation taken in float32 and cast back (Laguna's softplus), not in the model's dtype
    float32: bool = False

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"gate activation {self.activation!r}: expected one of {sorted(ACTIVATIONS)}")

    def describe(self) -> dict[str, Any]:
        """The spec's ``output_gate`` entry."""
        return asdict(self)

    def phrase(self) -> str:
        """What the gate is, for refusals: "a sigmoid of gate_proj, one a channel"."""
        bias = f" plus {self.bias} (one a head)" if self.bias else ""
        per = "one a head" if self.per_head else "one a channel"
        return f"a {self.activation} of {self.projection}{bias}, {per}"

    def gates(
        self, attention: nn.Module, h: Tensor | None, head_dim: int, projected: Tensor | None = None
    ) -> Tensor:
        """The gate values ``[..., heads, D]`` (``[..., heads, 1]`` per head) of the attention input `h`, or
        of `projected`, what the projection already made of it (a [query | gate] projection that the
        adapter's queries came from: projecting `h` again would repeat that GEMM)."""
        g = getattr(attention, self.projection)(h) if projected is None else projected
        if self.with_query:
            g = g.unflatten(-1, (-1, 2 * head_dim)).chunk(2, dim=-1)[1]
        elif self.per_head:
            g = g[..., None]
        else:
            g = g.unflatten(-1, (-1, head_dim))
        if self.bias is not None:
            g = g + getattr(attention, self.bias)[:, None]
        act = ACTIVATIONS[self.activation]
        return act(g.float()).to(g.dtype) if self.float32 else act(g)

    def apply(
        self,
        attention: nn.Module,
        h: Tensor | None,
        out: Tensor,
        head_dim: int,
        projected: Tensor | None = None,
    ) -> Tensor:
        """The attention output `out` ``[..., heads * D]`` times its gates (:meth:`gates`)."""
        return (out.unflatten(-1, (-1, head_dim)) * self.gates(attention, h, head_dim, projected)).flatten(-2)
