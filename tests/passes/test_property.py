"""Property: random small graphs mixing LN / GELU / attention variants (complete or broken) with
unrelated ops. After the default pipeline the outputs equal the original's in ONNX Runtime, every
complete pattern is fused and every incomplete one is left as it was."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.passes._graphs import GraphBuilder, feeds_for, op_counts, run_ort
from trtforge.passes.pipeline import optimize_model

layernorm = st.fixed_dictionaries(
    {
        "square": st.sampled_from(["pow", "mul"]),
        "div": st.sampled_from(["div", "recip"]),
        "bias": st.booleans(),
        "eps_node": st.booleans(),
        "scale_first": st.booleans(),
        "complete": st.booleans(),
    }
).map(lambda p: ("layernorm", p))
gelu = st.fixed_dictionaries(
    {
        "form": st.sampled_from(["erf", "tanh"]),
        "grouping": st.sampled_from(["xh_g", "xg_h", "x_hg"]),
        "div": st.booleans(),
        "complete": st.booleans(),
    }
).map(lambda p: ("gelu", p))
attention = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["bhsd", "bshd"]),
        "scale": st.sampled_from(["split", "qk_div", "qk_mul"]),
        "mask": st.sampled_from(["none", "right", "left"]),
        "bias": st.booleans(),
        "complete": st.booleans(),
    }
).map(lambda p: ("attention", p))
unrelated = st.sampled_from(["relu", "tanh", "affine", "sigmoid"]).map(lambda k: ("unrelated", {"kind": k}))
blocks = st.lists(st.one_of(layernorm, gelu, attention, unrelated), min_size=1, max_size=4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=blocks, seed=st.integers(0, 2**16))
def test_random_graphs_fused_exactly_and_equal(blocks, seed):
    g = GraphBuilder(seed=seed)
    tanh_unrelated = 0
    for kind, params in blocks:
        getattr(g, kind)(**params)
        tanh_unrelated += kind == "unrelated" and params["kind"] == "tanh"
    model = g.build()
    fused, ledger = optimize_model(model)

    feeds = feeds_for(model, seed=seed)
    for ref, got in zip(run_ort(model, feeds), run_ort(fused, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)

    ops, want = op_counts(fused), g.expect
    assert ops.get("LayerNormalization", 0) == want.get("LayerNormalization", 0)
    assert ops.get("Gelu", 0) == want.get("Gelu", 0)
    assert ops.get("Attention", 0) == want.get("Attention", 0)
    # incomplete patterns keep their characteristic ops
    assert ops.get("ReduceMean", 0) == 2 * want.get("ln_incomplete", 0)
    assert ops.get("Softmax", 0) == want.get("attention_incomplete", 0)
    assert ops.get("Erf", 0) + ops.get("Tanh", 0) == want.get("gelu_incomplete", 0) + tanh_unrelated
    n_attn = want.get("Attention", 0) + want.get("attention_incomplete", 0)
    assert ops.get("Split", 0) == n_attn  # every attention block's Q/K/V projections merged
    assert ledger.passes[-1].verification is not None
