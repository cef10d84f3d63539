"""Before the build: run the staged graph in exact ONNX Runtime at the profile's MIN and MAX shapes.

A profile admits every shape between MIN and MAX, so a model that cannot compute MAX (a position
table shorter than the range, a reshape to a fixed size) would build an engine that fails at run
time. This stage catches it first and names the input, the shape and a `--shape` to pass instead.
Skipped, with the reason recorded, above `MAX_WEIGHT_BYTES` of weights, for graphs ONNX Runtime
cannot run (custom-domain plugin nodes, missing CPU kernels) and for static profiles.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.core.manifest import ShapeRange
from trtforge.core.shapes import format_range
from trtforge.errors import UserError
from trtforge.passes.verify import VERIFY_MAX_BYTES

MAX_WEIGHT_BYTES = VERIFY_MAX_BYTES  # pass verification's threshold: ORT time and memory grow with it
SEARCH_RUNS = 8  # runs spent finding a --shape that works, once MIN or MAX failed


def _exact_session(path: Path) -> Any:
    """The exact (no graph optimizations) session of trtforge.numerics; a failing run is reported by its
    exception, so ONNX Runtime's own log is kept to fatal errors."""
    from trtforge.numerics.sessions import exact_session

    return exact_session(path, quiet=True)


def _feeds(
    session: Any, shapes: Mapping[str, list[int]], vocab: Mapping[str, int], seed: int = 0
) -> dict[str, np.ndarray]:
    """Synthetic feeds (trtforge.numerics rules) at `shapes`; an input type numpy cannot hold is refused.

    Token ids span their embedding table (`vocab`) and masks are all ones: the hardest inputs of each
    shape. With ids of 0 and 1 and padded masks, a RoBERTa-style model (positions counted over the
    non-padding ids) ran at 100 tokens with 64 positions, and the range was accepted."""
    from trtforge.core.tensor_spec import numpy_dtype_of
    from trtforge.numerics.feeds import synthetic_array

    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in session.get_inputs():
        dtype = _NP.get(inp.type)  # e.g. "tensor(int64)"
        if dtype is None:
            raise _Unsupported(f"input '{inp.name}' has type {inp.type}")
        dtype = numpy_dtype_of(dtype) if isinstance(dtype, str) else np.dtype(dtype)
        array = synthetic_array(inp.name, dtype, tuple(shapes[inp.name]), rng, vocab.get(inp.name))
        if "mask" in inp.name.lower() and array.dtype.kind in "biu":
            array = np.ones_like(array)
        feeds[inp.name] = array
    return feeds


_NP = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bfloat16)": "bfloat16",  # ml_dtypes' (numerics.sessions.run feeds it to ONNX Runtime)
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class _Unsupported(Exception):
    """The graph cannot be checked here (not a problem of the shapes)."""


class ProfileRangeError(UserError):
    """The model cannot run at the profile's `end` ("min"/"max"); `runs` holds, per ranged input, the
    furthest shapes toward that end that ran, so a caller may narrow ranges it chose itself."""

    def __init__(self, message: str, end: str, runs: Mapping[str, list[int]]) -> None:
        super().__init__(message)
        self.end, self.runs = end, dict(runs)

    def narrowed(self, profile: Mapping[str, ShapeRange]) -> dict[str, ShapeRange]:
        """`profile` with the failing end of each ranged input moved to the shapes that ran."""
        out = dict(profile)
        for name, shape in self.runs.items():
            r = profile[name]
            lo, hi = (shape, r.max) if self.end == "min" else (r.min, shape)
            out[name] = ShapeRange(list(lo), list(r.opt), list(hi))
        return out


def _weight_bytes(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    total = 0
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            total += int(next((e.value for e in t.external_data if e.key == "length"), 0) or 0)
        else:
            total += len(t.raw_data) or t.ByteSize()
    return total


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def _custom_domains(path: Path) -> list[str]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return sorted({n.domain for n in proto.graph.node if n.domain not in ("", "ai.onnx", "ai.onnx.ml")})


def _run(session: Any, shapes: Mapping[str, list[int]], vocab: Mapping[str, int]) -> str | None:
    """None when the graph runs at `shapes`, else ONNX Runtime's message (first lines)."""
    try:
        from trtforge.numerics.sessions import run

        run(session, _feeds(session, shapes, vocab))
    except _Unsupported:
        raise
    except Exception as e:  # ORT raises its own exception types for any failing kernel
        text = str(e).strip().splitlines()
        return " ".join(text[:3])[:600] or type(e).__name__
    return None


def check_profile(onnx_path: str | Path, profile: Mapping[str, ShapeRange]) -> dict[str, Any]:
    """Run the graph at the profile's MIN and MAX; UserError when it cannot, else a record of what ran."""
    path = Path(onnx_path)
    record: dict[str, Any] = {"ran": [], "skipped": None, "seconds": 0.0}
    t0 = time.perf_counter()
    dynamic = {n: r for n, r in profile.items() if r.min != r.max}
    if not dynamic:
        record["skipped"] = "every input has one shape (a static profile): nothing to range-check"
        return record
    weights = _weight_bytes(path)
    if weights > MAX_WEIGHT_BYTES:
        record["skipped"] = (
            f"weights are {_size(weights)}, above the {_size(MAX_WEIGHT_BYTES)} threshold of the "
            "ONNX Runtime shape check"
        )
        return record
    domains = _custom_domains(path)
    if domains:
        record["skipped"] = (
            f"the graph holds custom-domain nodes ({', '.join(domains)}) ONNX Runtime cannot run"
        )
        return record
    try:
        session = _exact_session(path)
    except Exception as e:  # a graph ORT cannot load is not a shape problem; the build still decides
        record["skipped"] = f"ONNX Runtime cannot load the graph: {str(e).strip().splitlines()[0][:300]}"
        return record
    points = {label: {n: list(getattr(r, attr)) for n, r in profile.items()} for label, attr in _POINTS}
    import onnx

    from trtforge.numerics.feeds import embedding_rows

    vocab = embedding_rows(onnx.load(str(path), load_external_data=False))
    try:
        failures = {}
        for label, shapes in points.items():
            if label == "OPT":
                continue
            error = _run(session, shapes, vocab)
            record["ran"].append(label)
            if error is not None:
                failures[label] = error
        if failures:
            opt_error = _run(session, points["OPT"], vocab)
            if opt_error is not None:
                record["skipped"] = (
                    f"the graph fails in ONNX Runtime at OPT too, so not because of the range: {opt_error}"
                )
                return record
            end = "max" if "MAX" in failures else "min"
            runs = _furthest(session, dynamic, end, vocab)
            raise ProfileRangeError(_message(failures, dynamic, runs), end, runs)
    except _Unsupported as e:
        record["skipped"] = f"no synthetic inputs for this graph: {e}"
    finally:
        record["seconds"] = round(time.perf_counter() - t0, 3)
    return record


_POINTS = (("MIN", "min"), ("MAX", "max"), ("OPT", "opt"))


def _between(a: list[int], b: list[int], k: int, steps: int) -> list[int]:
    return [x + (y - x) * k // steps for x, y in zip(a, b)]


def _furthest(
    session: Any, dynamic: Mapping[str, ShapeRange], end: str, vocab: Mapping[str, int]
) -> dict[str, list[int]]:
    """Shapes near `end` ("min"/"max") that run: a bounded bisection on the line from OPT (at most
    `SEARCH_RUNS` runs; OPT itself runs), then one run per axis position taking it to `end`."""
    steps = max(abs(e - o) for r in dynamic.values() for o, e in zip(r.opt, getattr(r, end)))

    def at(k: int) -> dict[str, list[int]]:
        return {n: _between(list(r.opt), list(getattr(r, end)), k, steps) for n, r in dynamic.items()}

    good, bad = 0, steps
    for _ in range(SEARCH_RUNS):
        if bad - good <= 1:
            break
        mid = (good + bad) // 2
        if _run(session, at(mid), vocab) is None:
            good = mid
        else:
            bad = mid
    best = at(good)
    # Then each axis position alone (axis 0 of every input together, ...): a batch may reach `end`
    # even where the sequence cannot.
    for axis in range(max(len(r.opt) for r in dynamic.values())):
        trial = {
            n: [getattr(r, end)[a] if a == axis else d for a, d in enumerate(best[n])]
            for n, r in dynamic.items()
        }
        if trial != best and _run(session, trial, vocab) is None:
            best = trial
    return best


def _message(
    failures: Mapping[str, str], dynamic: Mapping[str, ShapeRange], runs: Mapping[str, list[int]]
) -> str:
    """Name the failing end, each ranged input's shape there, and --shape options whose range ends at
    the furthest shapes that ran (`runs`)."""
    label = "MAX" if "MAX" in failures else "MIN"
    attr, error = label.lower(), failures[label]
    shapes = ", ".join(f"{n} {'x'.join(map(str, getattr(r, attr)))}" for n, r in dynamic.items())
    fixes = []
    for name, rng in dynamic.items():
        lo, hi = (runs[name], rng.max) if label == "MIN" else (rng.min, runs[name])
        fixes.append(f"--shape {name}:{format_range(ShapeRange(list(lo), list(rng.opt), list(hi)))}")
    return (
        f"the model cannot run at the profile's {label} shapes ({shapes}): ONNX Runtime fails with: {error}. "
        "An engine built for this range would fail on such inputs; pass a range the model can take, e.g. "
        f"{' '.join(fixes)} (its {label} is the furthest shape toward the requested one that ran)."
    )
