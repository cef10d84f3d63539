"""bench_throughput.py's roofline: the decode steps' bound by hand on a small case, and the published
TensorRT-LLM rows put on that yardstick at their own machine's bandwidth and precision."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import LlamaConfig

from benchmarks import bench_throughput as bt


def _shape() -> bt.Shape:
    return bt.Shape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=100, ffn=128, elem_bytes=2)


def test_decode_wave_is_the_larger_of_compute_and_bytes_each_step() -> None:
    s = _shape()
    rows, out_len, bw = [5, 7], 3, 1e9  # a slow HBM: the bytes bind
    t, b, flops_sum = bt.decode_wave_time(s, rows, out_len, bw)
    want_t = want_b = want_f = 0.0
    for j in (1, 2):
        ctx = sum(rows) + len(rows) * j
        bytes_ = s.decode_weight_bytes + ctx * s.kv_bytes_per_token
        attention = 4.0 * s.layers * s.heads * s.head_dim * ctx
        flops = len(rows) * 2.0 * (s.linear_params + s.head_params) + attention
        want_t += max(flops / bt.PEAK_FLOPS, bytes_ / bw)
        want_b += bytes_
        want_f += flops
    assert (t, b, flops_sum) == pytest.approx((want_t, want_b, want_f))
    assert bt.decode_wave_time(s, rows, out_len)[0] < t  # the H200's bandwidth by default: faster


def test_peer_shares_use_each_peers_machine_and_precision() -> None:
    bf16 = bt.Shape.of(LlamaConfig(**bt.SHAPES["8b"]), 2)
    fp8 = dataclasses.replace(bf16, linear_bytes=1, linear_speedup=2.0, kv_elem_bytes=1)
    rows = bt.peer_shares(bf16, fp8)
    published = [(w, p) for w, peers in bt.PUBLISHED.items() for p, r in peers.items() if r is not None]
    assert [(r["workload"], r["peer"]) for r in rows] == published
    for r in rows:
        shares = [r["roofline_share"][b] for b in bt.PEER_SHARE_BATCHES]
        assert all(0 < v < 1 for v in shares)
        assert shares == sorted(shares, reverse=True)  # a larger batch only raises the roofline
        isl, osl = bt.FIXED[r["workload"]]
        h100 = "h100" in r["peer"]
        shape, bw = (bf16, bt.H100_HBM_BYTES_PER_S) if h100 else (fp8, bt.HBM_BYTES_PER_S)
        roof = bt.roofline(shape, [isl] * bt.PEER_REQUESTS[r["workload"]], osl, 256, 10**12, bw)
        assert r["roofline_share"][256] == pytest.approx(r["output_tok_s"] / roof["output_tok_s"])
    # the v0.10 H100 rows are on the H100's bandwidth: on the H200's their share would be lower
    row = next(r for r in rows if r["workload"] == "2048/2048" and "h100" in r["peer"])
    at_h200 = bt.roofline(bf16, [2048] * 1500, 2048, 256, 10**12)
    assert row["output_tok_s"] / at_h200["output_tok_s"] < row["roofline_share"][256]
