"""--shape parsing, validation and derived profile defaults."""

from __future__ import annotations

import pytest

from trtforge.core.manifest import ShapeRange
from trtforge.core.shapes import AxisLimit, format_range, parse_shape_option, resolve_profile
from trtforge.core.tensor_spec import TensorSpec
from trtforge.errors import UserError

IDS = TensorSpec("input_ids", "int64", (-1, -1), ("batch", "seq"))
MASK = TensorSpec("attention_mask", "int64", (-1, -1), ("batch", "seq"))
STATIC = TensorSpec("scale", "float32", (1, 4))


def test_parse_like_trtexec() -> None:
    name, rng = parse_shape_option("input_ids:1x16:8x128:32x512")
    assert name == "input_ids"
    assert (rng.min, rng.opt, rng.max) == ([1, 16], [8, 128], [32, 512])
    assert format_range(rng) == "1x16:8x128:32x512"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("input_ids:1x16:8x128", "not NAME:MIN:OPT:MAX"),
        ("input_ids:1xa:8x128:32x512", "'1xa' is not a shape"),
        ("input_ids:1x16:8x8:32x512", "MIN <= OPT <= MAX"),
        ("input_ids:1x16x2:8x128x2:32x512x2", "rank 3"),
        ("nope:1x1:1x1:1x1", "unknown input"),
    ],
)
def test_bad_shapes(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        resolve_profile([IDS, MASK], [spec])


def test_static_dim_must_match() -> None:
    with pytest.raises(UserError, match="model fixes it to 4"):
        resolve_profile([STATIC], ["scale:1x3:1x3:1x3"])


def test_derived_defaults_share_symbols_and_use_examples() -> None:
    profile, derived = resolve_profile([IDS, MASK, STATIC], None, {"input_ids": [2, 40]})
    assert profile["input_ids"] == ShapeRange([1, 1], [2, 40], [32, 512])
    assert profile["attention_mask"] == profile["input_ids"], "inputs sharing symbols share ranges"
    assert profile["scale"] == ShapeRange([1, 4], [1, 4], [1, 4])
    assert set(derived) == {"input_ids", "attention_mask"}


def test_derived_defaults_without_examples_take_opt_8_and_128() -> None:
    """What the README and `compile --help` say of an ONNX source (no example inputs): 1/8/32 on dim 0,
    1/128/512 on the others."""
    profile, _ = resolve_profile([IDS, MASK], None)
    assert profile["input_ids"] == profile["attention_mask"] == ShapeRange([1, 1], [8, 128], [32, 512])


def test_user_range_propagates_to_symbol_peers() -> None:
    profile, derived = resolve_profile([IDS, MASK], ["input_ids:1x1:4x64:8x256"])
    assert profile["attention_mask"] == ShapeRange([1, 1], [4, 64], [8, 256])
    assert set(derived) == {"attention_mask"}


SEQ_LIMIT = {"input_ids": {1: AxisLimit(1, 64, "config.max_position_embeddings = 64 of BertModel")}}


def test_derived_ranges_respect_known_limits() -> None:
    """A limit on one input's axis bounds every input sharing the symbol; OPT stays within it."""
    profile, derived = resolve_profile([IDS, MASK], None, {"input_ids": [2, 100]}, SEQ_LIMIT)
    assert profile["input_ids"] == ShapeRange([1, 1], [2, 64], [32, 64])
    assert profile["attention_mask"] == profile["input_ids"]
    assert set(derived) == {"input_ids", "attention_mask"}


def test_exact_limits_fix_the_axis() -> None:
    pixels = TensorSpec("pixel_values", "float32", (-1, 3, -1, -1), ("batch", None, "h", "w"))
    limits = {"pixel_values": {2: AxisLimit(224, 224, "config.image_size"), 3: AxisLimit(224, 224, "x")}}
    profile, _ = resolve_profile([pixels], None, None, limits)
    assert profile["pixel_values"] == ShapeRange([1, 3, 224, 224], [8, 3, 224, 224], [32, 3, 224, 224])


def test_user_range_beyond_a_limit_is_refused_with_its_source_and_a_fix() -> None:
    """The limit of input_ids reaches attention_mask through the shared 'seq' symbol."""
    with pytest.raises(UserError) as e:
        resolve_profile([IDS, MASK], ["attention_mask:1x1:4x32:8x128"], None, SEQ_LIMIT)
    text = str(e.value)
    assert "--shape attention_mask: dim 1 ranges 1..128, but the model takes at most 64" in text
    assert "config.max_position_embeddings = 64 of BertModel" in text
    assert "--shape attention_mask:1x1:4x32:8x64" in text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("input_ids:1x1:1x1:1x2000000", "above the limit of 1048576"),
        ("input_ids:1x1:1x1:1x99999999999999999999999", "above the limit of 1048576"),
        ("input_ids:1x1:1x1:1x1e9", "'1x1e9' is not a shape"),
        ("input_ids:1x1:1x1:65536x65536", "above TensorRT's 2\\*\\*31 - 1 per tensor"),
    ],
)
def test_dimensions_are_bounded(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        resolve_profile([IDS, MASK], [spec])


def test_user_ranges_of_inputs_sharing_a_dim_name_must_agree() -> None:
    """Before: input_ids seq 8 and attention_mask seq 8..9 built an engine no feed could satisfy (the
    ONNX Runtime range check saw the graph fail at OPT too and skipped itself)."""
    same = ["input_ids:1x8:2x8:4x8", "attention_mask:1x8:2x8:4x8"]
    assert resolve_profile([IDS, MASK], same)[0]["attention_mask"].max == [4, 8]
    with pytest.raises(
        UserError, match=r"--shape attention_mask: dim 1 is 'seq', which --shape input_ids ranges"
    ):
        resolve_profile([IDS, MASK], ["input_ids:1x8:2x8:4x8", "attention_mask:1x8:2x9:4x9"])
