"""Numerics shared by every verifier: ONNX Runtime sessions made for a purpose (exact for accuracy,
fast for latency), synthetic feeds from input specs, and one set of comparison metrics.

May import ``trtforge.core`` only.
"""

from trtforge.numerics.compare import Metrics, Tolerance, compare_arrays, cosine, row_cosines
from trtforge.numerics.cpu import cpu_isa, isa_summary
from trtforge.numerics.feeds import model_feed, synthetic_array, synthetic_feed
from trtforge.numerics.sessions import EXACT, FAST, exact_session, fast_session, is_exact, make_session, run

__all__ = [
    "EXACT",
    "FAST",
    "Metrics",
    "Tolerance",
    "compare_arrays",
    "cosine",
    "cpu_isa",
    "exact_session",
    "fast_session",
    "is_exact",
    "isa_summary",
    "make_session",
    "model_feed",
    "row_cosines",
    "run",
    "synthetic_array",
    "synthetic_feed",
]
