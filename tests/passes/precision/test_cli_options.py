"""The conversion `trtforge optimize` runs from its precision options."""

from __future__ import annotations

import numpy as np

from tests.passes.precision.test_convert import _mlp
from trtforge.passes.precision.cli_options import convert_with_options


def test_convert_with_options_reads_precision_data(tmp_path) -> None:
    path = tmp_path / "samples.npz"
    np.savez(path, x=np.random.default_rng(1).standard_normal((6, 16)).astype(np.float32))
    _, rec = convert_with_options(_mlp(), precision="fp16", keep_fp32=["mm2"], precision_data=str(path))
    assert rec.data_source == "user data" and rec.sample_batches >= 1
    assert [k.name for k in rec.kept_fp32] == ["mm2"]
    _, noop = convert_with_options(_mlp(), precision="fp32", precision_data=str(tmp_path / "missing.npz"))
    assert noop.status == "noop-fp32"
