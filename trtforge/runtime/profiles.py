"""Optimization-profile layout and per-call input validation (pure Python, no GPU, no TensorRT).

A dynamic-shape engine built with ``trtforge compile --streams S`` holds S copies of its K base profiles:
profile ``c*K + k`` is base profile ``k`` of copy ``c``. Concurrently used execution contexts of a
dynamic-shape engine must each use a different profile (tensorrt-facts.md §4.3), so session lane ``c``
only ever selects profiles of copy ``c``. Static-shape engines have one implicit profile and any number of
lanes may share it.

Validation runs before anything is enqueued and raises :class:`UserError` naming the input and the
allowed range; results are cached per shape signature so the hot path is a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trtforge.core.manifest import Manifest, ShapeRange, TensorSpec
from trtforge.core.policy import MAX_STREAMS
from trtforge.core.tensor_spec import shape_mismatch
from trtforge.errors import UserError, is_int, shown
from trtforge.runtime._dtypes import dtype_name, numpy_dtype, torch_dtype

_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class IOSpec:
    """A manifest TensorSpec as the runtime binds it: dtype resolved to torch/NumPy once, for the hot path."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    torch_dtype: torch.dtype
    numpy_dtype: np.dtype[Any] | None

    @classmethod
    def from_tensor_spec(cls, t: TensorSpec) -> IOSpec:
        """Resolve the dtype names of a manifest TensorSpec once."""
        return cls(t.name, t.dtype, tuple(t.shape), torch_dtype(t.dtype, where=t.name), numpy_dtype(t.dtype))

    @property
    def is_dynamic(self) -> bool:
        """True when some dimension is -1 (resolved per call)."""
        return any(d < 0 for d in self.shape)


def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"


@dataclass(frozen=True)
class ProfileLayout:
    """K base profiles repeated `copies` times; `base[k]` maps input name -> ShapeRange."""

    base: tuple[dict[str, ShapeRange], ...]
    copies: int
    dynamic: bool

    @classmethod
    def from_manifest(cls, m: Manifest, *, where: str = "manifest") -> ProfileLayout:
        """Split `m.profiles` into `m.streams` identical copies (UserError if they are not identical)."""
        dynamic = any(d < 0 for t in m.inputs for d in t.shape)
        copies = max(1, int(m.streams))
        profiles = list(m.profiles)
        if not profiles:
            if dynamic:
                raise UserError(
                    f"{where}: inputs have dynamic dimensions (-1) but no optimization profiles are "
                    "recorded; the engine cannot be run. "
                    "Rebuild it with `trtforge compile` (it records the profiles)."
                )
            return cls(base=({},), copies=copies, dynamic=False)
        if len(profiles) % copies:
            raise UserError(
                f"{where}: {len(profiles)} optimization profiles cannot be {copies} copies "
                f"(streams={copies}) of one base set; the manifest is inconsistent. "
                "Rebuild with `trtforge compile --streams N`."
            )
        k = len(profiles) // copies
        base = tuple(profiles[:k])
        for c in range(1, copies):
            if list(profiles[c * k : (c + 1) * k]) != list(base):
                raise UserError(
                    f"{where}: profile copy {c} (profiles {c * k}..{c * k + k - 1}) differs from copy 0; "
                    "`--streams` copies must be identical. Rebuild with `trtforge compile --streams N`."
                )
        return cls(base=base, copies=copies, dynamic=dynamic)

    @property
    def per_copy(self) -> int:
        """K: profiles per copy."""
        return len(self.base)

    def profile_index(self, lane: int, base_index: int) -> int:
        """Engine profile index that `lane` uses for base profile `base_index` (static engines: 0)."""
        if not self.dynamic:
            return base_index
        return lane * len(self.base) + base_index

    def check_lanes(self, n: int, *, engine: str = "engine") -> int:
        """`n` as an int; UserError unless `n` lanes can run concurrently (one profile copy per lane when
        dynamic). A NumPy integer is an integer (it was refused as "session(streams=2): streams must be an
        integer")."""
        if not is_int(n):
            raise UserError(
                f"session(streams={shown(n)}): streams must be an integer >= 1, got {type(n).__name__}."
            )
        n = int(n)
        if n < 1:
            raise UserError(f"session(streams={n}): the number of streams must be at least 1.")
        if n > MAX_STREAMS:
            raise UserError(
                f"session(streams={n:,}) on {engine}: at most {MAX_STREAMS} streams run concurrently (a "
                "GPU's hardware work queues); each lane is an execution context with its own memory. Use "
                f"streams<={MAX_STREAMS}."
            )
        if self.dynamic and n > self.copies:
            raise UserError(
                f"session(streams={n}) on {engine}: the engine has dynamic input shapes and holds "
                f"{self.copies} copy(ies) of its optimization profiles, one per concurrently running "
                "execution context (TensorRT requires a separate profile per concurrent context of a "
                f"dynamic-shape engine). Rebuild with `trtforge compile --streams {n}` or use "
                f"streams<={self.copies}."
            )
        return n


class InputValidator:
    """Checks a feed dict (names, dtype, rank, shape within a profile) and picks the base profile.

    Raises UserError before anything is enqueued. Tensors may be torch tensors (any device) or NumPy arrays;
    no value is read, only metadata.
    """

    def __init__(self, inputs: Sequence[IOSpec], layout: ProfileLayout, *, engine: str = "engine"):
        self.inputs = tuple(inputs)
        self.layout = layout
        self.engine = engine
        self._names = frozenset(s.name for s in self.inputs)
        self._cache: dict[tuple[tuple[int, ...], ...], int] = {}

    def validate(self, feeds: Mapping[str, Any]) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """Return (base profile index, shapes in input order) or raise UserError naming the problem."""
        if type(feeds) is not dict and not isinstance(feeds, Mapping):  # (a dict: one cheap check)
            raise UserError(
                f"{self.engine}: inputs must be a dict of input name -> tensor, got {type(feeds).__name__}; "
                f"the engine's inputs are {', '.join(repr(s.name) for s in self.inputs)}."
            )
        if len(feeds) != len(self.inputs):
            self._raise_names(feeds)
        shapes = []
        for spec in self.inputs:
            t = feeds.get(spec.name)
            if t is None:
                self._raise_names(feeds)
            dt = getattr(t, "dtype", None)
            if dt is None or not hasattr(t, "shape"):
                raise UserError(
                    f"{self.engine}: input '{spec.name}' is a {type(t).__name__}; pass a torch.Tensor or a "
                    f"numpy.ndarray of {spec.dtype}."
                )
            if dt is not spec.torch_dtype and (spec.numpy_dtype is None or dt != spec.numpy_dtype):
                self._raise_dtype(spec, t)
            shapes.append(tuple(t.shape))
        key = tuple(shapes)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._select(key)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit, key

    # -- slow paths: only on a cache miss or an error ------------------------------------------------
    def _raise_names(self, feeds: Mapping[str, Any]) -> None:
        given = set(feeds)
        missing = sorted(self._names - given)
        extra = sorted(given - self._names, key=str)  # (keys of several types: {1: x, "y": x})
        for name in given & self._names:
            if feeds[name] is None:
                missing.append(name)
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing}")
        if extra:
            parts.append(f"unknown input name(s) {shown(extra)}")
        raise UserError(
            f"{self.engine}: {' and '.join(parts)}; the engine's inputs are "
            + ", ".join(f"'{s.name}' {s.dtype}{_fmt(s.shape)}" for s in self.inputs)
            + "."
        )

    def _raise_dtype(self, spec: IOSpec, t: Any) -> None:
        got = dtype_name(t.dtype) if isinstance(t.dtype, torch.dtype | np.dtype) else str(t.dtype)
        # only the byte order differs ('>f4'): the message read "has dtype float32, expects float32"
        native = t.dtype.newbyteorder("=") if isinstance(t.dtype, np.dtype) else None
        if native is not None and native != t.dtype and native == spec.numpy_dtype:
            raise UserError(
                f"{self.engine}: input '{spec.name}' is a NumPy array of {got} in non-native byte order "
                f"({t.dtype.str!r}); the engine reads {spec.dtype} in this machine's byte order. Convert it "
                f"first: array.astype(numpy.{got})."
            )
        hint = (
            "" if spec.numpy_dtype is not None else f" ({spec.dtype} has no NumPy dtype: pass a torch tensor)"
        )
        raise UserError(
            f"{self.engine}: input '{spec.name}' has dtype {got}, the engine expects {spec.dtype}{hint}. "
            f"trtforge does not cast inputs; convert it first (e.g. tensor.to(torch.{spec.dtype}))."
        )

    def _select(self, shapes: tuple[tuple[int, ...], ...]) -> int:
        """First base profile whose ranges contain every input shape; UserError with the ranges otherwise."""
        for spec, shape in zip(self.inputs, shapes):
            axis = shape_mismatch(spec.shape, shape)
            if axis == -1:
                raise UserError(
                    f"{self.engine}: input '{spec.name}' has rank {len(shape)} (shape {_fmt(shape)}), "
                    f"the engine expects rank {len(spec.shape)}: {_fmt(spec.shape)} (-1 = dynamic)."
                )
            if axis is not None:
                raise UserError(
                    f"{self.engine}: input '{spec.name}' has shape {_fmt(shape)}, dimension {axis} must be "
                    f"{spec.shape[axis]} (engine shape {_fmt(spec.shape)}, -1 = dynamic)."
                )
        problems = []
        for k, ranges in enumerate(self.layout.base):
            bad = self._outside(ranges, shapes)
            if bad is None:
                return k
            problems.append(f"profile {k}: {bad}")
        fix = "Use shapes inside the range, or rebuild the engine with a wider profile (`trtforge compile`)."
        if len(problems) == 1:
            raise UserError(
                f"{self.engine}: {problems[0].removeprefix('profile 0: ')}, optimization profile 0. {fix}"
            )
        raise UserError(
            f"{self.engine}: input shapes are outside every optimization profile: "
            + "; ".join(problems)
            + f". {fix}"
        )

    def _outside(self, ranges: dict[str, ShapeRange], shapes: tuple[tuple[int, ...], ...]) -> str | None:
        for spec, shape in zip(self.inputs, shapes):
            r = ranges.get(spec.name)
            if r is None:
                continue
            for i, (d, lo, hi) in enumerate(zip(shape, r.min, r.max)):
                if not lo <= d <= hi:
                    return (
                        f"input '{spec.name}' has shape {_fmt(shape)} but the profile allows "
                        f"min {_fmt(r.min)} to max {_fmt(r.max)} (dimension {i}: {d} not in [{lo}, {hi}])"
                    )
        return None


__all__ = ["IOSpec", "InputValidator", "ProfileLayout"]
