"""Benchmark: every Hopper-kernel config against cuDNN SDPA, one case at a time (kernel time).

    PYTHONPATH=. python3 benchmarks/bench_attention_hopper_configs.py --cases 64:1:2048 128:0:1024

Shows what the autotuner chooses between: each config's TFLOP/s as a CUDA-graph replay
(triton.testing.do_bench_cudagraph, median; no launch cost) next to torch SDPA's cuDNN backend
timed the same way, same inputs, B=8, H=16 by default. A case is D:causal:S. Needs an sm_90 GPU.
`--config` times configs that are not (yet) candidates instead, e.g. one a kernel change adds:

    ... --cases 128:0:2048 --config num_wg=2,block_n=128,stages=3,o_in_k=1 \
        --config num_wg=2,block_n=128,stages=3
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.kernels import flash_attention_hopper as kernel_hopper
from trtforge.kernels.configs import HopperConfig, hopper_configs


def _tflops(b: int, h: int, s: int, d: int, causal: bool, ms: float) -> float:
    return 4.0 * b * h * s * s * d * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12


def _graph_ms(fn) -> float:
    return float(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", required=True, help="D:causal:S, e.g. 128:1:2048")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--config", action="append", type=_parse_config, help="HopperConfig fields, k=v,...")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    b, h = args.batch, args.heads
    for case in args.cases:
        d, causal, s = (int(x) for x in case.split(":"))
        bench_case(b, h, s, d, bool(causal), dtype, args.config)


def _parse_config(text: str) -> HopperConfig:
    """`num_wg=2,block_n=128,stages=3,o_in_k=1` -> HopperConfig (booleans as 0/1)."""
    types = {f.name: f.type for f in dataclasses.fields(HopperConfig)}
    fields = {k: int(v) for k, v in (kv.split("=", 1) for kv in text.split(","))}
    unknown = sorted(set(fields) - set(types))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown HopperConfig field(s) {unknown}; fields are {sorted(types)}"
        )
    return HopperConfig(**{k: bool(v) if types[k] in (bool, "bool") else v for k, v in fields.items()})


def bench_case(
    b: int, h: int, s: int, d: int, causal: bool, dtype: torch.dtype, configs: list | None = None
) -> None:
    """Print cuDNN's TFLOP/s and every Hopper config's (with its error against cuDNN's output)."""
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ref = sdpa(q, k, v, is_causal=causal)
        cudnn = _tflops(b, h, s, d, causal, _graph_ms(lambda: sdpa(q, k, v, is_causal=causal)))
    print(f"D={d} causal={int(causal)} S={s} {dtype}: cudnn {cudnn:.0f} TFLOP/s", flush=True)
    out = torch.empty_like(q)
    for c in configs or hopper_configs(d, causal):
        launch = functools.partial(kernel_hopper.launch, q, k, v, out, d**-0.5, causal, c)
        launch()
        err = (out.float() - ref.float()).abs().max().item()
        t = _tflops(b, h, s, d, causal, _graph_ms(launch))
        print(f"  {t:6.0f} ({t / cudnn:.2f}x)  err {err:.1e}  {c}", flush=True)


if __name__ == "__main__":
    main()
