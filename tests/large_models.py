"""Protobuf's 2 GB limit brought down to a small size, so fast tests drive the large-model code paths."""

from __future__ import annotations

import onnx
import pytest

from trtforge.core import onnx_io


def protobuf_limit(monkeypatch: pytest.MonkeyPatch, threshold: int, room: int) -> None:
    """From now on trtforge takes a model with `threshold` bytes of weights or more for a large one
    (core.onnx_io.EXTERNAL_DATA_THRESHOLD), and a whole ModelProto of `threshold + room` bytes or more cannot
    be serialised, as protobuf refuses a message past 2 GB (what onnx's checker and shape inference and
    ONNX Runtime from bytes need). `room` is the graph beside its weights: the real threshold, 1.8 GB,
    leaves 0.35 GB of 2 GiB for it."""
    serialize = onnx.ModelProto.SerializeToString

    def limited(self: onnx.ModelProto, **kwargs: object) -> bytes:
        data = serialize(self, **kwargs)
        if len(data) >= threshold + room:
            raise ValueError(f"Message onnx.ModelProto exceeds maximum protobuf size of 2GB: {len(data)}")
        return data

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", limited)
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_THRESHOLD", threshold)
