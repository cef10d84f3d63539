"""Benchmark: host (Python) cost of one attention launch, next to torch SDPA's, same process.

    PYTHONPATH=. python3 benchmarks/bench_attention_launch_overhead.py

A tiny problem (B=H=1, S=128, D=64, FP16) so the GPU work is negligible: wall time per call over
300 back-to-back calls is the host cost of the launch path. Rows: the public API with a fixed
Hopper config, the Hopper kernel's launch alone, its four copy-engine descriptors, the
eligibility check, the public API with the portable kernel's default config, and torch SDPA (the
peer). Then a cProfile of the public API, heaviest functions first. Needs a CUDA GPU (sm_90 for
the Hopper rows).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

from trtforge.kernels import flash_attention as kernel
from trtforge.kernels import flash_attention_hopper as kernel_hopper
from trtforge.kernels.configs import default_config, hopper_configs


def per_call_us(fn, n: int = 300) -> float:
    """Mean wall time of `fn` over `n` calls (one warm-up call first), in microseconds."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    hopper = hopper_configs(64)[0]
    portable = default_config(64, "float16")
    cases = {
        "flash_attention(config=hopper)": lambda: kernel.flash_attention(q, k, v, out=out, config=hopper),
        "kernel_hopper.launch": lambda: kernel_hopper.launch(q, k, v, out, 0.125, False, hopper),
        "4x _desc": lambda: [kernel_hopper._desc(t, 64, 64) for t in (q, k, v, out)],
        "_hopper_eligible": lambda: kernel._hopper_eligible(q, k, v, out, None),
        "flash_attention(config=portable default)": lambda: kernel.flash_attention(
            q, k, v, out=out, config=portable
        ),
        "torch sdpa (peer)": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    }
    for name, fn in cases.items():
        print(f"{name:42s} {per_call_us(fn):8.1f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        kernel.flash_attention(q, k, v, out=out, config=hopper)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    print(text.getvalue())


if __name__ == "__main__":
    main()
