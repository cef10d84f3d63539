"""Profile layout (copies per stream) and input validation: names, dtype, rank, range, messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtforge.core.manifest import ShapeRange
from trtforge.errors import UserError
from trtforge.runtime.profiles import InputValidator, IOSpec, ProfileLayout
from trtforge.runtime.standin import standin_manifest


def _validator(manifest):
    layout = ProfileLayout.from_manifest(manifest)
    return InputValidator([IOSpec.from_tensor_spec(t) for t in manifest.inputs], layout, engine="eng")


class TestProfileLayout:
    def test_copies_map_lanes_to_their_own_profiles(self):
        m = standin_manifest(streams=4)
        m.profiles = [
            p
            for _ in range(4)
            for p in (
                {"x": ShapeRange([1, 64], [2, 64], [8, 64])},
                {"x": ShapeRange([9, 64], [16, 64], [32, 64])},
            )
        ]
        layout = ProfileLayout.from_manifest(m)
        assert layout.per_copy == 2 and layout.copies == 4 and layout.dynamic
        assert [layout.profile_index(lane, 1) for lane in range(4)] == [1, 3, 5, 7]
        assert [layout.profile_index(lane, 0) for lane in range(4)] == [0, 2, 4, 6]

    def test_too_many_streams_names_the_fix(self):
        layout = ProfileLayout.from_manifest(standin_manifest(streams=2))
        layout.check_lanes(2)
        with pytest.raises(UserError, match=r"--streams 3.*streams<=2"):
            layout.check_lanes(3, engine="model.engine")
        with pytest.raises(UserError, match="at least 1"):
            layout.check_lanes(0)

    def test_static_engine_allows_lanes_up_to_the_stream_limit_on_profile_0(self):
        """A static engine needs no profile copy a lane; up to MAX_STREAMS lanes (compile's --streams
        bound too). Before: session(streams=10**6) went on to make a million execution contexts."""
        from trtforge.core.policy import MAX_STREAMS

        layout = ProfileLayout.from_manifest(standin_manifest(static_batch=4))
        assert not layout.dynamic
        layout.check_lanes(16)
        assert layout.check_lanes(MAX_STREAMS) == MAX_STREAMS
        assert layout.profile_index(7, 0) == 0
        refused = rf"streams=1,000,000\) on m\.engine: at most {MAX_STREAMS} streams"
        with pytest.raises(UserError, match=refused):
            layout.check_lanes(10**6, engine="m.engine")

    def test_copies_must_be_identical(self):
        m = standin_manifest(streams=2)
        m.profiles[1] = {"x": ShapeRange([1, 64], [4, 64], [16, 64])}
        with pytest.raises(UserError, match="copy 1 .* differs from copy 0"):
            ProfileLayout.from_manifest(m)

    def test_profile_count_must_divide_by_streams(self):
        m = standin_manifest(streams=2)
        m.streams = 3
        with pytest.raises(UserError, match="cannot be 3 copies"):
            ProfileLayout.from_manifest(m)

    def test_dynamic_inputs_without_profiles_are_refused(self):
        m = standin_manifest()
        m.profiles = []
        with pytest.raises(UserError, match="no optimization profiles"):
            ProfileLayout.from_manifest(m)


class TestInputValidator:
    def test_valid_torch_and_numpy_inputs(self):
        v = _validator(standin_manifest(batch=(1, 8, 32)))
        assert v.validate({"x": torch.zeros(5, 64)}) == (0, ((5, 64),))
        assert v.validate({"x": np.zeros((32, 64), np.float32)}) == (0, ((32, 64),))
        assert v.validate({"x": np.zeros((1, 64), np.float32)})[0] == 0

    def test_missing_and_unknown_names(self):
        v = _validator(standin_manifest())
        with pytest.raises(
            UserError, match=r"missing input\(s\) \['x'\] and unknown input name\(s\) \['y'\]"
        ):
            v.validate({"y": torch.zeros(2, 64)})
        with pytest.raises(UserError, match=r"unknown input name\(s\) \['z'\].*'x' float32\(-1, 64\)"):
            v.validate({"x": torch.zeros(2, 64), "z": torch.zeros(1)})
        with pytest.raises(UserError, match="missing"):
            v.validate({})

    def test_dtype_is_not_cast(self):
        v = _validator(standin_manifest())
        with pytest.raises(UserError, match="input 'x' has dtype float16, the engine expects float32"):
            v.validate({"x": torch.zeros(2, 64, dtype=torch.float16)})
        with pytest.raises(UserError, match="input 'x' has dtype float64"):
            v.validate({"x": np.zeros((2, 64))})

    def test_rank_and_static_dims(self):
        v = _validator(standin_manifest())
        with pytest.raises(
            UserError, match=r"input 'x' has rank 3 \(shape \(2, 64, 1\)\), the engine expects rank 2"
        ):
            v.validate({"x": torch.zeros(2, 64, 1)})
        with pytest.raises(UserError, match=r"dimension 1 must be 64"):
            v.validate({"x": torch.zeros(2, 63)})

    def test_out_of_range_names_input_and_range(self):
        v = _validator(standin_manifest(batch=(2, 8, 32)))
        with pytest.raises(UserError) as e:
            v.validate({"x": torch.zeros(33, 64)})
        msg = str(e.value)
        assert "input 'x' has shape (33, 64)" in msg
        assert "min (2, 64) to max (32, 64)" in msg and "dimension 0: 33 not in [2, 32]" in msg
        with pytest.raises(UserError, match=r"dimension 0: 1 not in \[2, 32\]"):
            v.validate({"x": torch.zeros(1, 64)})

    def test_not_a_tensor(self):
        v = _validator(standin_manifest())
        with pytest.raises(UserError, match="input 'x' is a list; pass a torch.Tensor or a numpy.ndarray"):
            v.validate({"x": [[1.0] * 64]})

    def test_selects_the_first_profile_that_fits(self):
        m = standin_manifest()
        m.profiles = [
            {"x": ShapeRange([1, 64], [2, 64], [8, 64])},
            {"x": ShapeRange([9, 64], [16, 64], [32, 64])},
        ]
        v = _validator(m)
        assert v.validate({"x": torch.zeros(4, 64)})[0] == 0
        assert v.validate({"x": torch.zeros(20, 64)})[0] == 1
        with pytest.raises(
            UserError, match=r"outside every optimization profile: profile 0: .*; profile 1: "
        ):
            v.validate({"x": torch.zeros(40, 64)})

    def test_results_are_cached_per_shape(self):
        v = _validator(standin_manifest())
        v.validate({"x": torch.zeros(3, 64)})
        v.validate({"x": torch.zeros(3, 64)})
        assert list(v._cache) == [((3, 64),)]
