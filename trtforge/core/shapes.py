"""Optimization-profile shapes: parse `--shape NAME:MIN:OPT:MAX` (dims like `1x16`, as trtexec) and
derive printed defaults for dynamic inputs the user did not specify.

Derived ranges respect the model's known limits (`AxisLimit`: e.g. a Hugging Face config's position
count, an image size, a position table in the graph); a user range beyond a known limit is refused
with the limit's source and a `--shape` that fits. Every dimension is bounded by `MAX_DIM` and every
input's element count by `MAX_VOLUME`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtforge.core.manifest import ShapeRange
from trtforge.core.tensor_spec import TensorSpec, graph_inputs, is_dynamic, shape_mismatch
from trtforge.errors import UserError

# Derived defaults for a dynamic dim: (min, default opt, max floor). Axis 0 is treated as batch.
BATCH_DEFAULT = (1, 8, 32)
OTHER_DEFAULT = (1, 128, 512)
# Bounds on any profile dimension and on an input's element count: TensorRT indexes most tensors with
# 32-bit offsets, and a dimension above 2**20 (a million tokens/pixels per axis) is a typo in practice.
MAX_DIM = 1 << 20
MAX_VOLUME = (1 << 31) - 1


@dataclass(frozen=True)
class AxisLimit:
    """What one input axis can take: `lo`..`hi`, and where that limit was read (for messages/records)."""

    lo: int
    hi: int
    source: str


# input name -> axis -> limit
ShapeLimits = Mapping[str, Mapping[int, AxisLimit]]


def parse_dims(text: str, *, where: str) -> list[int]:
    """'1x16' -> [1, 16]; a scalar shape is written as an empty string."""
    if text == "":
        return []
    try:
        dims = [int(d) for d in text.lower().split("x")]
    except ValueError:
        raise UserError(f"{where}: '{text}' is not a shape; write dims as NxM, e.g. 1x128.") from None
    if any(d < 0 for d in dims):
        raise UserError(f"{where}: negative dimension in '{text}'.")
    big = [d for d in dims if d > MAX_DIM]
    if big:
        raise UserError(
            f"{where}: dimension {big[0]} in '{text}' is above the limit of {MAX_DIM} (2**20); "
            "profile dimensions are sizes the engine must allocate for."
        )
    return dims


def parse_shape_option(spec: str) -> tuple[str, ShapeRange]:
    """Parse one `NAME:MIN:OPT:MAX` option value (a name may itself contain ':' — split from the right)."""
    parts = spec.rsplit(":", 3)
    if len(parts) != 4 or not parts[0]:
        raise UserError(
            f"--shape '{spec}' is not NAME:MIN:OPT:MAX (e.g. input_ids:1x16:8x128:32x512); "
            "one --shape per dynamic input."
        )
    name, lo, mid, hi = parts
    where = f"--shape {name}"
    return name, ShapeRange(
        parse_dims(lo, where=where), parse_dims(mid, where=where), parse_dims(hi, where=where)
    )


def parse_feed_shapes(
    specs: Sequence[str], inputs: Sequence[TensorSpec], option: str
) -> dict[str, list[int]]:
    """`NAME:DIMS` option values (e.g. ``input_values:1x16000``) -> {name: dims}: each an input of the
    model (`inputs`), of its rank and its fixed dims, no dynamic dim 0, at most MAX_VOLUME elements, given
    once; UserError naming `option` otherwise."""
    by_name = {t.name: t for t in inputs}
    out: dict[str, list[int]] = {}
    named: dict[str, tuple[str, int]] = {}  # dynamic dim name -> (the input that sized it, its size)
    for spec in specs:
        name, sep, text = spec.rpartition(":")
        if not sep or not name:
            raise UserError(f"{option} '{spec}' is not NAME:DIMS (e.g. input_values:1x16000).")
        where = f"{option} {name}"
        if name not in by_name:
            raise UserError(f"{where}: the model has no input '{name}'; its inputs: {', '.join(by_name)}.")
        if name in out:
            raise UserError(f"{where}: given twice; one {option} per input.")
        dims = parse_dims(text, where=where)
        _check_fits(by_name[name], dims, where)
        empty = [
            a for a, (d, want) in enumerate(zip(dims, by_name[name].shape)) if d == 0 and is_dynamic(want)
        ]
        if empty:
            raise UserError(
                f"{where}: dim {empty[0]} of {_fmt(dims)} is 0; an empty input runs no computation, so "
                "nothing would be checked. Give sizes of at least 1."
            )
        if math.prod(dims) > MAX_VOLUME:
            raise UserError(f"{where}: {_fmt(dims)} holds more than 2**31 - 1 elements; give a smaller one.")
        for axis, size in enumerate(dims):
            sym = by_name[name].symbol(axis)
            first = named.setdefault(sym, (name, size)) if sym is not None else None
            if first is not None and first[1] != size:
                raise UserError(
                    f"{where}: dim {axis} is '{sym}', which {option} {first[0]} sets to {first[1]}, not "
                    f"{size}; inputs sharing a dim name take one size (give it once, the others follow)."
                )
        out[name] = dims
    return out


def normalize_shapes(
    shapes: Any,
) -> dict[str, ShapeRange] | tuple[str, ...] | None:
    """What the API accepts for `shapes`, in the two forms the rest reads: --shape strings (one string is
    one option), or {name: ShapeRange} whose values may also be "MIN:OPT:MAX" strings or (min, opt, max)
    dim lists. UserError for anything else, naming the input."""
    if shapes is None:
        return None
    if isinstance(shapes, str):
        return (shapes,)
    if isinstance(shapes, Mapping):
        out: dict[str, ShapeRange] = {}
        for name, value in shapes.items():
            if isinstance(value, ShapeRange):
                out[name] = value
            elif isinstance(value, str):
                out[name] = parse_shape_option(f"{name}:{value}")[1]
            elif isinstance(value, Sequence) and len(value) == 3 and all(_is_dims(v) for v in value):
                where = f"--shape {name}"
                out[name] = ShapeRange(*(parse_dims("x".join(map(str, v)), where=where) for v in value))
            else:
                raise UserError(
                    f"shapes['{name}'] is {value!r}; expected a ShapeRange, a 'MIN:OPT:MAX' string such as "
                    "'1x16:8x128:32x512' or (min, opt, max) dim lists."
                )
        return out
    if isinstance(shapes, Iterable):
        specs = tuple(shapes)
        bad = [s for s in specs if not isinstance(s, str)]
        if bad:
            raise UserError(f"shapes holds {bad[0]!r}; expected 'NAME:MIN:OPT:MAX' strings or a dict.")
        return specs
    raise UserError(f"shapes is {type(shapes).__name__}; expected 'NAME:MIN:OPT:MAX' strings or a dict.")


def _is_dims(value: Any) -> bool:
    import numbers

    return isinstance(value, Sequence) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in value
    )


def _check_fits(desc: TensorSpec, dims: tuple[int, ...], where: str, label: str = "") -> None:
    """UserError naming `where` when `dims` (`label`: which of a range's shapes) has another rank than
    input `desc`, or another size on an axis the model fixes."""
    axis = shape_mismatch(desc.shape, dims)
    if axis == -1:
        raise UserError(
            f"{where}: {label}{_fmt(dims)} has rank {len(dims)}, but input '{desc.name}' has rank "
            f"{len(desc.shape)} (shape {_fmt(desc.shape)})."
        )
    if axis is not None:
        raise UserError(
            f"{where}: {label}dim {axis} is {dims[axis]} but the model fixes it to {desc.shape[axis]} "
            f"(shape {_fmt(desc.shape)})."
        )


def validate_range(desc: TensorSpec, rng: ShapeRange) -> None:
    """Check rank, static dims and MIN <= OPT <= MAX for one input; UserError naming it otherwise."""
    where = f"--shape {desc.name}"
    for label, dims in (("MIN", rng.min), ("OPT", rng.opt), ("MAX", rng.max)):
        _check_fits(desc, dims, where, f"{label} ")
    for axis, (lo, mid, hi) in enumerate(zip(rng.min, rng.opt, rng.max)):
        if not lo <= mid <= hi:
            raise UserError(
                f"{where}: dim {axis} needs MIN <= OPT <= MAX, got {lo}, {mid}, {hi} "
                f"(MIN {_fmt(rng.min)}, OPT {_fmt(rng.opt)}, MAX {_fmt(rng.max)})."
            )
        if lo < 1 and desc.shape[axis] < 0:
            raise UserError(f"{where}: dim {axis} MIN must be at least 1, got {lo}.")
    for label, dims in (("MIN", rng.min), ("OPT", rng.opt), ("MAX", rng.max)):
        if any(d > MAX_DIM for d in dims):
            raise UserError(f"{where}: {label} {_fmt(dims)} has a dimension above the limit of {MAX_DIM}.")
    volume = 1
    for d in rng.max:
        volume *= d
    if volume > MAX_VOLUME:
        raise UserError(
            f"{where}: MAX {_fmt(rng.max)} holds {volume} elements, above TensorRT's 2**31 - 1 per tensor; "
            "pass a smaller MAX."
        )


def check_limits(desc: TensorSpec, rng: ShapeRange, limits: Mapping[int, AxisLimit]) -> None:
    """Refuse a user range outside the model's known limits, naming the limit's source and a fix."""
    for axis, lim in sorted(limits.items()):
        if axis >= len(rng.min):
            continue
        lo, hi = rng.min[axis], rng.max[axis]
        if lo >= lim.lo and hi <= lim.hi:
            continue
        fixed = [list(d) for d in (rng.min, rng.opt, rng.max)]
        for dims in fixed:
            dims[axis] = min(max(dims[axis], lim.lo), lim.hi)
        suggestion = f"--shape {desc.name}:" + ":".join(_fmt(d) for d in fixed)
        bound = f"at most {lim.hi}" if hi > lim.hi else f"at least {lim.lo}"
        raise UserError(
            f"--shape {desc.name}: dim {axis} ranges {lo}..{hi}, but the model takes {bound} there "
            f"({lim.source}); pass e.g. {suggestion}."
        )


def resolve_profile(
    inputs: Sequence[TensorSpec],
    user: Mapping[str, ShapeRange] | Iterable[str] | None,
    example_shapes: Mapping[str, Sequence[int]] | None = None,
    limits: ShapeLimits | None = None,
) -> tuple[dict[str, ShapeRange], dict[str, ShapeRange]]:
    """Build one profile for every input: user ranges validated, the rest derived within `limits`.

    Returns (profile, derived) where `derived` holds the ranges trtforge chose (callers print them).
    Inputs sharing a symbolic dim (e.g. 'batch') get the same derived range on that dim, and a limit
    on one input's axis holds for every axis with the same symbol.
    """
    user = normalize_shapes(user)
    if user is not None and not isinstance(user, Mapping):
        parsed: dict[str, ShapeRange] = {}
        for spec in user:
            name, rng = parse_shape_option(spec)
            if name in parsed:
                raise UserError(f"--shape given twice for input '{name}'.")
            parsed[name] = rng
        user = parsed
    user = dict(user or {})
    by_name = {d.name: d for d in inputs}
    unknown = sorted(set(user) - set(by_name))
    if unknown:
        raise UserError(
            f"--shape names unknown input(s) {unknown}; the model's inputs are {sorted(by_name)}."
        )
    axis_limits = _spread_limits(inputs, limits or {})
    profile: dict[str, ShapeRange] = {}
    derived: dict[str, ShapeRange] = {}
    symbol_ranges: dict[str, tuple[int, int, int]] = {}
    set_by: dict[str, str] = {}  # symbol -> the input whose --shape gave its range
    for name, rng in user.items():
        validate_range(by_name[name], rng)
        check_limits(by_name[name], rng, axis_limits.get(name, {}))
        profile[name] = rng
        for axis, sym in enumerate(by_name[name].symbols):
            if sym and by_name[name].shape[axis] < 0:
                got = (rng.min[axis], rng.opt[axis], rng.max[axis])
                first = symbol_ranges.setdefault(sym, got)
                set_by.setdefault(sym, name)
                if first != got:
                    raise UserError(
                        f"--shape {name}: dim {axis} is '{sym}', which --shape {set_by[sym]} ranges "
                        f"{':'.join(map(str, first))}, not {':'.join(map(str, got))}; inputs sharing a dim "
                        "name take one range (the engine could never be fed both at once)."
                    )
    for desc in inputs:
        if desc.name in profile:
            continue
        if all(d >= 0 for d in desc.shape):
            profile[desc.name] = ShapeRange(list(desc.shape), list(desc.shape), list(desc.shape))
            continue
        lo, mid, hi = [], [], []
        example = (example_shapes or {}).get(desc.name)
        for axis, d in enumerate(desc.shape):
            if d >= 0:
                lo.append(d), mid.append(d), hi.append(d)
                continue
            sym = desc.symbols[axis] if axis < len(desc.symbols) else None
            if sym and sym in symbol_ranges:
                a, b, c = symbol_ranges[sym]
            else:
                a, b, floor = BATCH_DEFAULT if axis == 0 else OTHER_DEFAULT
                if example is not None and axis < len(example):
                    b = int(example[axis])
                c = max(floor, b)
                lim = axis_limits.get(desc.name, {}).get(axis)
                if lim is not None:
                    a, c = max(a, lim.lo), min(c, lim.hi)
                    b = min(max(b, a), c)
                if sym:
                    symbol_ranges[sym] = (a, b, c)
            lo.append(a), mid.append(b), hi.append(c)
        rng = ShapeRange(lo, mid, hi)
        profile[desc.name] = derived[desc.name] = rng
    return profile, derived


def _spread_limits(inputs: Sequence[TensorSpec], limits: ShapeLimits) -> dict[str, dict[int, AxisLimit]]:
    """Per-input axis limits, with each limit also applied to every axis sharing its symbol."""
    by_symbol: dict[str, AxisLimit] = {}
    out: dict[str, dict[int, AxisLimit]] = {}
    for desc in inputs:
        for axis, lim in (limits.get(desc.name) or {}).items():
            out.setdefault(desc.name, {})[axis] = tighter_limit(out.get(desc.name, {}).get(axis), lim)
            sym = desc.symbols[axis] if axis < len(desc.symbols) else None
            if sym:
                by_symbol[sym] = tighter_limit(by_symbol.get(sym), lim)
    for desc in inputs:
        for axis, sym in enumerate(desc.symbols):
            if sym in by_symbol and axis < len(desc.shape) and desc.shape[axis] < 0:
                out.setdefault(desc.name, {})[axis] = tighter_limit(
                    out.get(desc.name, {}).get(axis), by_symbol[sym]
                )
    return out


def tighter_limit(a: AxisLimit | None, b: AxisLimit) -> AxisLimit:
    """The intersection of two limits of one axis, keeping the source of the tighter upper bound."""
    if a is None:
        return b
    if (a.lo, a.hi) == (b.lo, b.hi):
        return a
    return AxisLimit(max(a.lo, b.lo), min(a.hi, b.hi), a.source if a.hi <= b.hi else b.source)


def limits_to_dict(limits: ShapeLimits) -> dict[str, dict[str, dict[str, Any]]]:
    """JSON-ready form of `limits` for records: {input: {axis: {min, max, source}}}."""
    return {
        name: {str(axis): {"min": lim.lo, "max": lim.hi, "source": lim.source} for axis, lim in axes.items()}
        for name, axes in limits.items()
    }


def onnx_input_descs(model: Any) -> list[TensorSpec] | None:
    """The ONNX model's (or file's) inputs (`trtforge.core.tensor_spec.graph_inputs`), so `--shape` can be
    validated before TensorRT parses the graph; None when an input's rank is not recorded (the parser
    then decides)."""
    specs = graph_inputs(model)
    return None if any(not s.rank_known for s in specs) else specs


def format_range(rng: ShapeRange) -> str:
    """'1x8:8x128:32x512' — the --shape syntax, so a printed default can be pasted back."""
    return ":".join(_fmt(d) for d in (rng.min, rng.opt, rng.max))


def _fmt(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)
