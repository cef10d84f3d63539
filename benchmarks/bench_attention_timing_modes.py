"""Benchmark: one attention problem timed three ways, to tell kernel speed from timing artefacts.

    PYTHONPATH=. python3 benchmarks/bench_attention_timing_modes.py

FP16, B=8, H=16, S=8192, D=128, non-causal: three Hopper-kernel configs (launched directly) and
torch SDPA's cuDNN backend, each timed with triton.testing.do_bench (L2 flushed per repetition),
do_bench_cudagraph (graph replay) and 20 back-to-back launches between two CUDA events. Needs an
sm_90 GPU.
"""

from __future__ import annotations

import functools

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.kernels import flash_attention_hopper as kernel_hopper
from trtforge.kernels.configs import HopperConfig

B, H, S, D = 8, 16, 8192, 128


def back_to_back_ms(fn, n: int = 20) -> float:
    """Mean time of `n` launches queued back to back (one untimed launch first)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main() -> None:
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    flops = 4.0 * B * H * S * S * D
    configs = {
        "pingpong/persistent": HopperConfig(2, 128, 3, 1),
        "no-pingpong/persistent": HopperConfig(2, 128, 3, 1, False),
        "pingpong/non-persistent": HopperConfig(2, 128, 3, 1, True, False),
    }
    launch = functools.partial(kernel_hopper.launch, q, k, v, out, D**-0.5, False)
    fns = {name: functools.partial(launch, config=c) for name, c in configs.items()}

    def cudnn() -> None:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            sdpa(q, k, v)

    fns["cudnn"] = cudnn
    for name, fn in fns.items():
        eager = triton.testing.do_bench(fn, warmup=25, rep=100)
        graph = triton.testing.do_bench_cudagraph(fn, rep=100)
        tflops = [flops / ms / 1e9 for ms in (eager, graph, back_to_back_ms(fn))]
        eager_t, graph_t, b2b_t = (f"{t:5.0f}" for t in tflops)
        print(f"{name:24s} eager+flush {eager_t}  graph {graph_t}  back-to-back {b2b_t} TFLOP/s")


if __name__ == "__main__":
    main()
