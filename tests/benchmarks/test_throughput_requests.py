"""How bench_throughput.py picks each workload's request count: NAME:N over --requests over
--peer-requests (TensorRT-LLM's published counts) over --waves."""

from __future__ import annotations

import argparse

from benchmarks.bench_throughput import FIXED, PEER_REQUESTS, requests_for


def _args(**kw) -> argparse.Namespace:
    base = {"counts": {}, "mixed_requests": None, "requests": None, "peer_requests": False, "waves": None}
    return argparse.Namespace(**(base | kw))


def test_peer_requests_are_trtllm_counts_for_every_fixed_workload() -> None:
    args = _args(peer_requests=True)
    assert set(PEER_REQUESTS) == set(FIXED)
    assert {name: requests_for(name, args, 512, 10**7, 1.0) for name in FIXED} == {
        "128/128": 30000,
        "128/2048": 3000,
        "2048/128": 3000,
        "2048/2048": 1500,
        "1000/1000": 3000,
    }


def test_request_count_precedence() -> None:
    both = _args(peer_requests=True, counts={"1000/1000": 7}, requests=11, waves=2)
    assert requests_for("1000/1000", both, 512, 10**7, 1.0) == 7  # NAME:N first
    assert requests_for("2048/2048", both, 512, 10**7, 1.0) == 11  # then --requests
    assert requests_for("2048/2048", _args(peer_requests=True, waves=2), 512, 10**7, 1.0) == 1500
    # --waves alone: waves x the running batch the pool holds (here the pool, 10,000 tokens / 4,096)
    assert requests_for("2048/2048", _args(waves=3), 512, 10_000, 1.0) == 6
    assert requests_for("2048/2048", _args(), 512, 10**7, 1.0) is None  # the script's default
