"""Optimization-profile shapes: parse `--shape NAME:MIN:OPT:MAX` (dims like `1x16`, as trtexec) and
derive printed defaults for dynamic inputs the user did not specify."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trtforge.compiler.manifest import ShapeRange
from trtforge.errors import UserError

# Derived defaults for a dynamic dim: (min, default opt, max floor). Axis 0 is treated as batch.
BATCH_DEFAULT = (1, 8, 32)
OTHER_DEFAULT = (1, 128, 512)


@dataclass(frozen=True)
class InputDesc:
    """A network input as the builder sees it: dims are ints, -1 for dynamic; `symbols` name them."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    symbols: tuple[str | None, ...] = ()


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


def validate_range(desc: InputDesc, rng: ShapeRange) -> None:
    """Check rank, static dims and MIN <= OPT <= MAX for one input; UserError naming it otherwise."""
    where = f"--shape {desc.name}"
    for label, dims in (("MIN", rng.min), ("OPT", rng.opt), ("MAX", rng.max)):
        if len(dims) != len(desc.shape):
            raise UserError(
                f"{where}: {label} {_fmt(dims)} has rank {len(dims)}, but input '{desc.name}' has rank "
                f"{len(desc.shape)} (shape {_fmt(desc.shape)})."
            )
        for axis, (d, model_d) in enumerate(zip(dims, desc.shape)):
            if model_d >= 0 and d != model_d:
                raise UserError(
                    f"{where}: {label} dim {axis} is {d} but the model fixes it to {model_d} "
                    f"(shape {_fmt(desc.shape)})."
                )
    for axis, (lo, mid, hi) in enumerate(zip(rng.min, rng.opt, rng.max)):
        if not lo <= mid <= hi:
            raise UserError(
                f"{where}: dim {axis} needs MIN <= OPT <= MAX, got {lo}, {mid}, {hi} "
                f"(MIN {_fmt(rng.min)}, OPT {_fmt(rng.opt)}, MAX {_fmt(rng.max)})."
            )
        if lo < 1 and desc.shape[axis] < 0:
            raise UserError(f"{where}: dim {axis} MIN must be at least 1, got {lo}.")


def resolve_profile(
    inputs: Sequence[InputDesc],
    user: Mapping[str, ShapeRange] | Iterable[str] | None,
    example_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[dict[str, ShapeRange], dict[str, ShapeRange]]:
    """Build one profile for every input: user ranges validated, the rest derived.

    Returns (profile, derived) where `derived` holds the ranges trtforge chose (callers print them).
    Inputs sharing a symbolic dim (e.g. 'batch') get the same derived range on that dim.
    """
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
    profile: dict[str, ShapeRange] = {}
    derived: dict[str, ShapeRange] = {}
    symbol_ranges: dict[str, tuple[int, int, int]] = {}
    for name, rng in user.items():
        validate_range(by_name[name], rng)
        profile[name] = rng
        for axis, sym in enumerate(by_name[name].symbols):
            if sym and by_name[name].shape[axis] < 0:
                symbol_ranges.setdefault(sym, (rng.min[axis], rng.opt[axis], rng.max[axis]))
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
                if sym:
                    symbol_ranges[sym] = (a, b, c)
            lo.append(a), mid.append(b), hi.append(c)
        rng = ShapeRange(lo, mid, hi)
        profile[desc.name] = derived[desc.name] = rng
    return profile, derived


def format_range(rng: ShapeRange) -> str:
    """'1x8:8x128:32x512' — the --shape syntax, so a printed default can be pasted back."""
    return ":".join(_fmt(d) for d in (rng.min, rng.opt, rng.max))


def _fmt(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)
