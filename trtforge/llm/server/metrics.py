"""The server's Prometheus metrics (``/metrics``), in a registry of its own.

Latencies and token counts are observed per request by the server; sequences running and waiting,
KV-cache occupancy and preemptions are read from the engine at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 60.0)
_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class _EngineCollector:
    """Gauges and counters read from the engine when /metrics is scraped."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        s = self.read()
        yield GaugeMetricFamily(
            "trtforge_num_requests_running", "Sequences in the running batch.", s["running"]
        )
        yield GaugeMetricFamily("trtforge_num_requests_waiting", "Sequences waiting to run.", s["waiting"])
        yield GaugeMetricFamily(
            "trtforge_kv_cache_usage_perc", "Fraction of KV-cache blocks held by sequences.", s["usage"]
        )
        yield GaugeMetricFamily("trtforge_kv_cache_blocks_used", "KV-cache blocks held.", s["used_blocks"])
        yield GaugeMetricFamily("trtforge_kv_cache_blocks_total", "KV-cache blocks in the pool.", s["blocks"])
        yield CounterMetricFamily("trtforge_num_preemptions", "Sequences preempted.", s["preemptions"])
        # speculative decoding (all 0 without it); the acceptance rate is SchedulerStats'
        yield CounterMetricFamily(
            "trtforge_spec_decode_num_draft_tokens", "Proposed tokens verified.", s["spec_draft_tokens"]
        )
        yield CounterMetricFamily(
            "trtforge_spec_decode_num_accepted_tokens", "Proposed tokens accepted.", s["spec_accepted_tokens"]
        )
        yield CounterMetricFamily(
            "trtforge_spec_decode_num_verify_rows", "Rows that verified proposals.", s["spec_verify_rows"]
        )
        yield GaugeMetricFamily(
            "trtforge_spec_decode_acceptance_rate",
            "Accepted / proposed tokens since start.",
            s["spec_acceptance_rate"],
        )


class Metrics:
    """Every metric of one server."""

    def __init__(self, read_engine: Callable[[], dict[str, Any]]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "trtforge_requests",
            "HTTP requests by endpoint and status; a stream's once it ends, by how it ended (200: every "
            "choice finished; an error event's code; 499: the client left first).",
            ["endpoint", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "trtforge_time_to_first_token_seconds", "Time to first token.", buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "trtforge_inter_token_latency_seconds", "Time between tokens.", buckets=_TOKEN, registry=r
        )
        self.e2e = Histogram(
            "trtforge_e2e_request_latency_seconds", "Request latency.", buckets=_LATENCY, registry=r
        )
        self.prompt_tokens = Counter(
            "trtforge_prompt_tokens", "Prompt tokens of admitted requests.", registry=r
        )
        self.generation_tokens = Counter("trtforge_generation_tokens", "Tokens generated.", registry=r)
        self.in_flight = Gauge(
            "trtforge_http_requests_in_flight", "Generation requests being served.", registry=r
        )
        self.intake = Gauge(
            "trtforge_http_requests_intake",
            "Generation requests being read, parsed and tokenized (at most --max-intake).",
            registry=r,
        )
        self.intake_waiting = Gauge(
            "trtforge_http_requests_intake_waiting",
            "Generation requests waiting to be read (their bodies unread).",
            registry=r,
        )
        r.register(_EngineCollector(read_engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)
