"""Rotary tables as a transformers rotary module computes them (its ``inv_freq``, ``attention_scaling``
and rope type), and :class:`RotaryDecoder`, the adapter base every RoPE family with a rotary module builds
on: :mod:`.rope`'s (Llama-style, Gemma, OLMo, Granite, StableLM, SmolLM3, Phi, Cohere, GLM, ...),
:mod:`.gpt_neox` and :mod:`.falcon` (GPT-J and CodeGen index a fixed table instead: :mod:`.gptj`). Its class
attributes are the rotary variants the families differ in, one place for all: interleaved channel pairs,
float32 tables, float32 rotation, NoPE layers (:meth:`RotaryDecoder.rotates`), queries scaled by their
position (:class:`QueryScaling`: Ministral 3's, Beam's; :attr:`RotaryDecoder.query_scaling`);
:class:`PerTypeRotary` keeps a table per layer type (Gemma 3, OLMo 3, Mellum, Beam; a type whose
``rope_parameters`` entry is null is NoPE) or per layer's base (Granite SWA's ``layer_rope_theta``).

Partial rotary needs nothing here: the module's ``inv_freq`` already covers only the rotated channels,
and :func:`~trtforge.llm.models.base.apply_rotary` passes the rest through.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from trtforge.llm.models.base import DecoderAdapter, DecoderSpec, apply_rotary, apply_rotary_interleaved


class RotaryTables:
    """cos/sin of a model's rotary module `rotary_emb`: fixed tables (default, linear, llama3, yarn, ...)
    or dynamic NTK (each sequence's frequencies from its own length, as transformers computes them for
    it run alone); 'longrope' by its short factors, up to its original length (:attr:`reach`: past it
    transformers switches every position of the call to the long factors, which keys cached under the
    short ones cannot follow, so the executors and the step export refuse longer sequences by that
    limit). With `layer_type`, the tables of that
    layer type in a module that keeps one set per type (Gemma 3's and OLMo 3's ``{type}_inv_freq`` buffers,
    their ``rope_type`` and ``config.rope_parameters`` keyed by type). `interleaved`: each frequency
    repeated twice in place (``c0, c0, c1, c1, ...``: the rotary of GLM, Cohere, Helium and ERNIE 4.5,
    which rotate channel pairs (0, 1), (2, 3), ...), not the two halves ``c0, c1, ..., c0, c1, ...``.
    `config`: the config the module was built from where it is not the model's (Granite SWA's modules, a
    copy each with its own ``rope_theta``)."""

    def __init__(
        self,
        model: nn.Module,
        rotary_emb: nn.Module,
        user: str,
        layer_type: str | None = None,
        interleaved: bool = False,
        config: Any = None,
    ) -> None:
        self.config = model.config if config is None else config
        self.module, self.layer_type = rotary_emb, layer_type
        self.interleaved = interleaved
        self._prefix = "" if layer_type is None else f"{layer_type}_"
        rope_type = getattr(rotary_emb, "rope_type", "default")
        self.rope_type = str(rope_type if layer_type is None else rope_type[layer_type])
        self.longrope = self.rope_type == "longrope"
        self.dynamic = self.rope_type == "dynamic"
        self._init: Any = None
        if self.dynamic:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            self._init = ROPE_INIT_FUNCTIONS[self.rope_type]

    def _params(self) -> dict[str, Any]:
        c = self.config
        params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
        return params if self.layer_type is None else dict(params.get(self.layer_type) or {})

    def _inv_freq(self) -> Tensor:
        # (longrope: the short factors' table, which the module's inv_freq holds only until a call of its
        # has passed the original length)
        name = "original_inv_freq" if self.longrope else "inv_freq"
        return getattr(self.module, f"{self._prefix}{name}")

    def _longrope_original(self) -> int:
        """The length up to which transformers rotates a longrope model by its short factors."""
        original = self._params().get("original_max_position_embeddings")
        return int(original if original is not None else self.config.original_max_position_embeddings)

    def _scaling(self) -> float:
        return float(getattr(self.module, f"{self._prefix}attention_scaling", 1.0))

    def describe(self) -> dict[str, Any]:
        """The spec's ``rotary`` entry: type, theta, rotated channels, attention scaling."""
        params = self._params()
        theta = params.get("rope_theta", getattr(self.config, "rope_theta", None))
        theta = theta if theta is not None else getattr(self.config, "rotary_emb_base", 10000.0)
        return {
            "type": self.rope_type,
            "theta": float(theta),
            "dim": int(self._inv_freq().numel() * 2),
            "attention_scaling": self._scaling(),
            "interleaved": self.interleaved,
        }

    @property
    def max_length(self) -> int:
        """The trained length (max_position_embeddings), times the factor of a dynamic rotary; at most
        a longrope's original length (:attr:`reach`)."""
        trained = int(self.config.max_position_embeddings)
        if self.longrope:
            return min(trained, self._longrope_original())
        if not self.dynamic:
            return trained
        return int(trained * max(float(self._params().get("factor", 1.0)), 1.0))

    @property
    def reach(self) -> tuple[int, str] | None:
        """The longest sequence these tables are meant for and where that comes from: the trained length,
        or the length a fixed rotary scaling extends it to (``original_max_position_embeddings`` times the
        ``factor``, or max_position_embeddings times it where the config names no original length),
        whichever is longer. None where nothing bounds them: a dynamic rotary (its base grows with each
        sequence's length, made to run past the trained one), or a config without
        max_position_embeddings."""
        trained = getattr(self.config, "max_position_embeddings", None)
        if self.longrope:
            return (
                self._longrope_original(),
                "original_max_position_embeddings of its longrope rotary scaling: past it transformers "
                "switches every position to the long factors, which keys cached under the short ones cannot "
                "follow",
            )
        if self.dynamic or not isinstance(trained, int) or isinstance(trained, bool) or trained < 1:
            return None
        params = self._params()
        factor = params.get("factor")
        if self.rope_type == "default" or not isinstance(factor, (int, float)) or factor <= 1:
            return trained, "max_position_embeddings in its config; its rotary is not scaled"
        original = params.get("original_max_position_embeddings")
        given = isinstance(original, int) and not isinstance(original, bool) and original > 0
        base, name = (
            (original, "original_max_position_embeddings") if given else (trained, "max_position_embeddings")
        )
        scaled = int(base * factor)
        if scaled <= trained:
            return (
                trained,
                f"max_position_embeddings in its config ({self.rope_type} rotary scaling included)",
            )
        return scaled, f"{name} {base} x the factor {factor:g} of its {self.rope_type} rotary scaling"

    def __call__(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """cos, sin ``[..., R]`` in `dtype`, computed in float32 and times the attention scaling as the HF
        module does; a dynamic rotary takes each token's frequencies from `rope_lens` (its sequence's
        length)."""
        inv_freq = self._inv_freq().to(device=position_ids.device, dtype=torch.float)
        if self.dynamic:
            if rope_lens is None:
                raise ValueError("dynamic rotary needs each token's sequence length (rope_lens)")
            # HF clamps lengths up to max_position_embeddings (the original table)
            lens = rope_lens.to(torch.int64).clamp(min=int(self.config.max_position_embeddings))
            unique, inverse = torch.unique(lens, return_inverse=True)
            kw = {} if self.layer_type is None else {"layer_type": self.layer_type}
            dev = position_ids.device
            tables = [self._init(self.config, dev, seq_len=n, **kw)[0] for n in unique.unbind(0)]
            inv_freq = torch.stack(tables).float().to(position_ids.device)[inverse]
        freqs = position_ids[..., None].float() * inv_freq
        if self.interleaved:  # (stack + flatten: repeat_interleave does not export to ONNX)
            emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        scaling = self._scaling()
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


@dataclass(frozen=True)
class QueryScaling:
    """Each query times a factor of its position (an attention temperature that grows with the context),
    computed in float32 from the position: Ministral 3's on every layer's rotated queries, Beam's and Llama
    4's on their NoPE layers' queries."""

    #: "llama4": ``1 + beta * log(1 + floor(position / period))`` (Ministral 3's ``llama_4_scaling_beta``
    #: over ``original_max_position_embeddings``: Llama 4's attention temperature tuning; see
    #: :attr:`from_one` for Llama 4's own); "ssmax": ``(1 + (position + 1) / period) ** beta``, as
    #: ``exp(beta * log1p(...))`` (Beam's scalable softmax)
    form: str
    beta: float
    period: int
    #: only the layers that do not rotate (NoPE) scale their queries (Beam, Llama 4); else every layer's
    nope_only: bool = False
    #: the queries multiplied in float32 and cast back (Beam), not by the factor cast to their dtype
    float32: bool = False
    #: the queries multiplied by the float32 factor in the dtype the two promote to (float32; a float64
    #: model's float64) and cast back (Llama 4's ``attn_temperature_tuning``)
    promoted: bool = False
    #: "llama4" counting positions from 1, by ``log1p``: ``1 + beta * log1p(floor((position + 1) /
    #: period))``, Llama 4's text model's own form (its ``floor_scale`` and ``attn_scale``)
    from_one: bool = False

    def __post_init__(self) -> None:
        if self.form not in ("llama4", "ssmax"):
            raise ValueError(f"query scaling form {self.form!r}: expected 'llama4' or 'ssmax'")

    def describe(self) -> dict[str, Any]:
        """The spec's ``rotary["query_scaling"]`` entry."""
        return asdict(self)

    def factor(self, position_ids: Tensor, dtype: torch.dtype) -> Tensor:
        """Each position's factor ``[..., 1]``: float32 where :attr:`float32` or :attr:`promoted`, else cast
        to `dtype`."""
        p = position_ids.float()
        if self.form == "llama4" and self.from_one:
            f = torch.log1p(torch.floor((p + 1.0) / self.period)) * self.beta + 1.0
        elif self.form == "llama4":
            f = 1 + self.beta * torch.log(1 + torch.floor(p / self.period))
        else:
            f = torch.exp(self.beta * torch.log1p((p + 1) / self.period))
        return f[..., None] if self.float32 or self.promoted else f[..., None].to(dtype)

    def scale(self, q: Tensor, factor: Tensor) -> Tensor:
        """The queries `q` times `factor` (:meth:`factor`, shaped to broadcast against them)."""
        if self.promoted:
            return (q * factor).to(q.dtype)
        return (q.float() * factor).to(q.dtype) if self.float32 else q * factor


class RotaryDecoder(DecoderAdapter):
    """A decoder whose positions are its rotary module's tables (``self.rope``, set by the subclass from
    its ``rotary_emb``): the spec, the longest sequence and the cos/sin tables every RoPE family shares."""

    rope: RotaryTables
    #: the tables pair channels (0, 1), (2, 3), ... (:class:`RotaryTables`' `interleaved`)
    interleaved: bool = False
    #: the tables stay float32 whatever the model's dtype (OLMo, ERNIE 4.5, Beam: their rotary modules do
    #: not cast them to the hidden states' dtype); without :attr:`float32_rotation`, q and k are rotated in
    #: the dtype the tables promote them to (float32; a float64 model's float64) and cast back (Beam's
    #: ``apply_rotary_pos_emb``)
    float32_tables: bool = False
    #: q and k rotated in float32 and cast back to their dtype (OLMo: by float32 tables; Cohere and ERNIE
    #: 4.5 cast q and k up themselves)
    float32_rotation: bool = False
    #: the queries scaled by their position (:class:`QueryScaling`): :meth:`rotary` then returns the
    #: tables and each position's factor; None: no scaling
    query_scaling: QueryScaling | None = None

    def _use_rotary(self, rotary_emb: nn.Module) -> None:
        """Take the tables of `rotary_emb` (:class:`RotaryTables`)."""
        self.rope = RotaryTables(self.model, rotary_emb, self.user, interleaved=self.interleaved)
        self.dynamic = self.rope.dynamic

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(
            positions="rotary",
            rotary=self._describe_rotary(self.rope.describe()),
            max_positions=getattr(self.config, "max_position_embeddings", None),
        )

    def _describe_rotary(self, rotary: dict[str, Any]) -> dict[str, Any]:
        """The spec's ``rotary`` entry: the tables' `rotary`, with the :attr:`query_scaling` where set."""
        if self.query_scaling is not None:
            rotary["query_scaling"] = self.query_scaling.describe()
        return rotary

    @property
    def max_length(self) -> int:
        return self.rope.max_length

    @property
    def position_reach(self) -> tuple[int, str] | None:
        return self.rope.reach

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> Any:
        """The tables (:meth:`_tables`), or where :attr:`query_scaling` is set the tables and each
        position's query factor ``[..., 1]`` (:meth:`QueryScaling.factor`)."""
        tables = self._tables(position_ids, dtype, rope_lens)
        if self.query_scaling is None:
            return tables
        return tables, self.query_scaling.factor(position_ids, dtype)

    def _tables(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> Any:
        """cos, sin as the HF rotary module computes them (:class:`RotaryTables`)."""
        return self.rope(position_ids, self._table_dtype(dtype), rope_lens)

    def rotary_over_heads(self, rope: Any) -> Any:
        """The tables (and the query factor, where there is one) with a heads axis at dim 1."""
        if rope is None or self.query_scaling is None:
            return self._tables_over_heads(rope)
        tables, factor = rope
        return self._tables_over_heads(tables), factor[:, None]

    def _tables_over_heads(self, tables: Any) -> Any:
        """:meth:`_tables`' output with a heads axis at dim 1."""
        return DecoderAdapter.rotary_over_heads(self, tables)

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if self.float32_tables else dtype

    def rotates(self, i: int) -> bool:
        """Whether layer i rotates its q and k (False: a NoPE layer, as SmolLM3's, Cohere 2's and EXAONE
        4's full-attention layers)."""
        return True

    def rotate(self, i: int, q: Tensor, k: Tensor, rope: Any) -> tuple[Tensor, Tensor]:
        """Layer i's q and k rotated by `rope`'s tables (:meth:`_rotate_tables`), then the queries scaled by
        its factor where :attr:`query_scaling` is set (and applies to layer i: its NoPE layers only, where
        ``nope_only``)."""
        if rope is None or self.query_scaling is None:
            return self._rotate_tables(i, q, k, rope)
        tables, factor = rope
        q, k = self._rotate_tables(i, q, k, tables)
        if self.query_scaling.nope_only and self.rotates(i):
            return q, k
        return self.query_scaling.scale(q, factor), k

    def _rotate_tables(self, i: int, q: Tensor, k: Tensor, tables: Any) -> tuple[Tensor, Tensor]:
        """Layer i's q and k rotated by `tables` (:meth:`_tables` with a heads axis)."""
        return self._rotate(i, q, k, tables)

    def _rotate(
        self, i: int, q: Tensor, k: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """q and k rotated (half-split or :attr:`interleaved` pairs, in float32 where
        :attr:`float32_rotation`), or as they are on a NoPE layer."""
        if rope is None or not self.rotates(i):
            return q, k
        cos, sin = rope
        apply = apply_rotary_interleaved if self.interleaved else apply_rotary
        if not self.float32_rotation and self.float32_tables:  # (promoted by the tables, cast back)
            return apply(q, cos, sin).to(q.dtype), apply(k, cos, sin).to(k.dtype)
        if not self.float32_rotation:
            return apply(q, cos, sin), apply(k, cos, sin)
        return apply(q.float(), cos, sin).to(q.dtype), apply(k.float(), cos, sin).to(k.dtype)


class PerTypeRotary(RotaryDecoder):
    """A rotary decoder whose layers rotate by one of several sets of tables: by default one per layer type
    (Gemma 3 text, OLMo 3, Mellum: the module's ``{type}_inv_freq`` each, from its type's
    ``config.rope_parameters`` entry); :meth:`rotary` returns ``{key: (cos, sin)}`` and :meth:`rotate` picks
    layer i's by :attr:`layer_types` (a family that keys its tables otherwise sets both in
    :meth:`_use_rotary`: Granite SWA's per-layer bases). Put first among the bases, before the family's own
    adapter."""

    #: each layer's key into :attr:`ropes` (its layer type by default; None: a NoPE layer)
    layer_types: list[str | None]
    ropes: dict[str, RotaryTables]

    def _use_rotary(self, rotary_emb: nn.Module) -> None:
        """One :class:`RotaryTables` per layer type of the model, from the module's tables of that type
        (:class:`RotaryTables`); a type whose ``rope_parameters``
        entry is null has none (NoPE: Beam's full-attention layers)."""
        params = getattr(self.config, "rope_parameters", None)
        nope = {t for t, p in params.items() if p is None} if isinstance(params, dict) else set()
        self.layer_types = [None if t in nope else t for t in self.config.layer_types[: self.num_layers]]
        types = sorted({t for t in self.layer_types if t is not None})
        self._use_tables({t: RotaryTables(self.model, rotary_emb, self.user, layer_type=t) for t in types})

    def _use_tables(self, ropes: dict[str, RotaryTables]) -> None:
        """Keep `ropes` (the tables by key); dynamic where any of them is."""
        self.ropes = ropes
        self.dynamic = any(r.dynamic for r in ropes.values())

    def rotates(self, i: int) -> bool:
        """Layer i rotates unless it has no tables (None in :attr:`layer_types`)."""
        return self.layer_types[i] is not None and super().rotates(i)

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(
            positions="rotary",
            rotary=self._describe_rotary({t: r.describe() for t, r in self.ropes.items()}),
            max_positions=getattr(self.config, "max_position_embeddings", None),
        )

    @property
    def max_length(self) -> int:
        trained = int(self.config.max_position_embeddings)  # (every layer NoPE: the trained length)
        return max((r.max_length for r in self.ropes.values()), default=trained)

    @property
    def position_reach(self) -> tuple[int, str] | None:
        """The farthest reach of the layer types' tables (None where one of them has no bound)."""
        reaches = [r.reach for r in self.ropes.values()]
        if not reaches or any(r is None for r in reaches):
            return None
        return max(reaches, key=lambda r: r[0])  # type: ignore[arg-type, return-value]

    def _tables(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """{layer type: (cos, sin)}, each as the HF rotary module computes that type's."""
        return {t: r(position_ids, self._table_dtype(dtype), rope_lens) for t, r in self.ropes.items()}

    def _tables_over_heads(self, tables: Any) -> Any:
        """Each layer type's pair with a heads axis at dim 1."""
        if tables is None:
            return None
        return {t: DecoderAdapter.rotary_over_heads(self, pair) for t, pair in tables.items()}

    def _rotate_tables(self, i: int, q: Tensor, k: Tensor, tables: Any) -> tuple[Tensor, Tensor]:
        """q and k rotated by the tables of layer i's key (as they are on a NoPE layer)."""
        key = self.layer_types[i]
        return super()._rotate_tables(i, q, k, None if tables is None or key is None else tables[key])
