"""Run a benchmark script and log every Triton JIT compilation it triggers, with its duration.

    PYTHONPATH=. python3 benchmarks/trace_jit_compiles.py benchmarks/bench_serving.py --rates 0 0 --skip-hf

A kernel launched with arguments of a specialization not met before (an integer that is now 1 or a
multiple of 16, a pointer now 16-byte aligned, a new constexpr) is compiled (or loaded from Triton's
disk cache) during that launch. Each one prints a line ``[jit +T s] Ns kernel(args)`` to stderr, so
that compilations inside a timed region show up between the script's own output, with what set this
one apart from the kernel's first compilation: constexprs (``NAME=``), argument types (``NAME:``) and
Triton's specialization marks (``NAME@``: divisible by 16, 16-byte aligned).
"""

from __future__ import annotations

import runpy
import sys
import time

from triton import knobs

_T0 = time.perf_counter()
_started: list[float] = []


def _before(**kwargs) -> None:
    _started.append(time.perf_counter())


def _after(**kwargs) -> None:
    now = time.perf_counter()
    took = now - _started.pop() if _started else float("nan")
    name = kwargs.get("repr", "?").split("(")[0]
    print(f"[jit +{now - _T0:.2f} s] {took:.3f}s {name} {_difference(kwargs)}", file=sys.stderr, flush=True)


_first: dict[str, dict] = {}


def _difference(kwargs: dict) -> str:
    """What this compilation's constexprs, argument types and specialization marks (divisible by 16,
    aligned: Triton's per-argument attributes) have that the same kernel's first compilation did not."""
    compile_ = kwargs.get("compile", {})
    fn = kwargs.get("fn")
    params = [p.name for p in getattr(getattr(fn, "jit_function", None), "params", [])]

    def named(path: object) -> str:  # Triton keys arguments by index paths, e.g. (3,)
        first = path[0] if isinstance(path, tuple) and path else path
        return params[first] if isinstance(first, int) and first < len(params) else str(path)

    now: dict[str, object] = {}
    for path, value in dict(compile_.get("constants", {})).items():
        now[f"{named(path)}="] = value
    for name, kind in dict(compile_.get("signature", {})).items():
        now[f"{name}:"] = kind
    configs = compile_.get("configs") or [{}]
    for path, marks in dict(configs[0]).items():
        now[f"{named(path)}@"] = marks
    name = getattr(fn, "name", "?")
    if name not in _first:
        _first[name] = now
        return "(first)"
    was = _first[name]
    changed = [k for k in sorted(set(now) | set(was)) if now.get(k) != was.get(k)]
    return "; ".join(f"{k}{now.get(k)!r} (first {was.get(k)!r})" for k in changed)[:600]


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: trace_jit_compiles.py SCRIPT [ARGS...]")
    knobs.runtime.jit_cache_hook = _before
    knobs.runtime.jit_post_compile_hook = _after
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
