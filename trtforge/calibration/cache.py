"""TensorRT-format calibration cache (text, per-tensor activation scales) for interchange.

Format, as TensorRT's calibrators wrote it and as ModelOpt's ``import_scales_from_calib_cache``
reads it: a header line ``TRT-<version>-<Algorithm>``, then one ``<tensor name>: <scale>`` line per
tensor, the scale being the float32 (amax / 127) as 8 hex digits of its big-endian bytes
(``struct.pack('!f', scale).hex()``).

trtforge appends its :class:`Fingerprint` to the header line (``TRT-<version>-<Algorithm> model=<hex>
data=<hex> [percentile=<p>] [real_tokens=yes|no]``): what the scales were computed for, so that a cache
beside a changed model, read with other data or at other settings, is refused rather than trusted by its
name. The header is the one line other readers skip
(ModelOpt reads every line after it as a tensor), so the body stays TensorRT's.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtforge._fileio import atomic_write_text, check_input_file
from trtforge.errors import UserError, shown

if TYPE_CHECKING:
    import numpy as np
    import onnx

ALGORITHMS = {
    "entropy": "EntropyCalibration2",
    "max": "MinMaxCalibration",
    "percentile": "PercentileCalibration",
    "mse": "MSECalibration",
}


def _trt_version_tag() -> str:
    """NV_TENSORRT_VERSION-style number of the installed TensorRT(-RTX) package, read from metadata."""
    for dist in ("tensorrt", "tensorrt-rtx", "tensorrt_rtx"):
        try:
            parts = [int(p) for p in metadata.version(dist).split(".")[:3]]
        except (metadata.PackageNotFoundError, ValueError):
            continue
        major, minor, patch = ([*parts, 0, 0, 0])[:3]
        return str(major * 1000 + minor * 100 + patch if major < 10 else major * 10000 + minor * 100 + patch)
    return "0"


#: hex digits of a fingerprint's sha256 kept in the header
_DIGITS = 32


@dataclass(frozen=True)
class Fingerprint:
    """What a cache's scales were computed for: the model (graph and weights, :func:`model_fingerprint`),
    the calibration batches (:func:`data_fingerprint`; None: not known) and the calibration settings
    besides the method (the header's algorithm names that) that change the scales, name -> value (values
    without spaces or '='; a cache of an older trtforge has none)."""

    model: str
    data: str | None = None
    settings: dict[str, str] = field(default_factory=dict)

    def header_fields(self) -> str:
        """The fields appended to the cache's header line."""
        fields = [f"model={self.model}", *([f"data={self.data}"] if self.data else [])]
        return " ".join([*fields, *(f"{k}={v}" for k, v in self.settings.items())])

    @classmethod
    def from_header(cls, header: str) -> Fingerprint | None:
        """The fingerprint a header line carries; None for one written without (TensorRT's, ModelOpt's)."""
        fields = dict(f.split("=", 1) for f in header.split()[1:] if "=" in f)
        if "model" not in fields:
            return None
        settings = {k: v for k, v in fields.items() if k not in ("model", "data")}
        return cls(fields["model"], fields.get("data"), settings)


def header_algorithm(header: str) -> str:
    """The algorithm a cache header names (``TRT-8501-EntropyCalibration2 ...`` -> EntropyCalibration2)."""
    return header.split(maxsplit=1)[0].rsplit("-", 1)[-1].strip() if header.strip() else ""


def _update(h: Any, kind: str, data: bytes | np.ndarray) -> None:
    """Feed `data` to `h` with its kind and length, so that no two sequences of parts hash alike."""
    h.update(f"{kind}:{len(data)}:".encode())
    h.update(data)


def model_fingerprint(model: onnx.ModelProto) -> str:
    """sha256 (its first hex digits) of `model`'s graph and weights: opsets, inputs, outputs, nodes,
    initializers and functions, each serialized alone (a model past 2 GB cannot be serialized whole)."""
    h = hashlib.sha256()
    g = model.graph
    for kind, parts in (
        ("opset", model.opset_import),
        ("input", g.input),
        ("output", g.output),
        ("node", g.node),
        ("initializer", g.initializer),
        ("sparse", g.sparse_initializer),
        ("function", model.functions),
    ):
        for part in parts:
            _update(h, kind, part.SerializeToString(deterministic=True))
    return h.hexdigest()[:_DIGITS]


def data_fingerprint(batches: Iterable[Mapping[str, np.ndarray]]) -> str:
    """sha256 (its first hex digits) of calibration `batches` as statistics see them: each input's name,
    dtype, shape and values, batch after batch."""
    import numpy as np

    h = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            a = np.ascontiguousarray(batch[name])
            _update(h, "input", f"{name}|{a.dtype.str}|{a.shape}".encode())
            _update(h, "values", a.reshape(-1).view(np.uint8))  # (bytes, without a copy; 0 of them too)
    return h.hexdigest()[:_DIGITS]


def format_cache(scales: dict[str, float], method: str, fingerprint: Fingerprint | None = None) -> str:
    """The cache text for `scales` (tensor -> scale) calibrated with `method`, its header carrying
    `fingerprint` when given."""
    header = f"TRT-{_trt_version_tag()}-{ALGORITHMS.get(method, 'EntropyCalibration2')}"
    lines = [f"{header} {fingerprint.header_fields()}" if fingerprint else header]
    for name, scale in scales.items():
        # A line is '<tensor>: <hex>' (readers split at ': '; ours at the last one) and the file is read by
        # lines (str.splitlines breaks at \r, \x85, \u2028 and more, not only \n). A plain ':' is fine:
        # tf2onnx names its tensors 'input:0'.
        if ": " in name or len(f"{name}:".splitlines()) > 1:
            raise UserError(
                f"tensor name {name!r} cannot be written to a calibration cache: its lines are "
                "'<tensor>: <hex scale>', so a name holding ': ' or a line break would not read back. Rename "
                "the tensor in the model."
            )
        lines.append(f"{name}: {struct.pack('!f', float(scale)).hex()}")
    return "\n".join(lines) + "\n"


def write_calibration_cache(
    path: str | os.PathLike[str],
    scales: dict[str, float],
    method: str,
    fingerprint: Fingerprint | None = None,
) -> Path:
    """Write the cache atomically, with `fingerprint` in its header; returns its path."""
    atomic_write_text(path, format_cache(scales, method, fingerprint))
    return Path(path)


def read_calibration_cache(path: str | os.PathLike[str]) -> tuple[str, dict[str, float]]:
    """(header, tensor -> scale) from a cache file; UserError naming the line when it is malformed or a
    scale is not a finite positive number (it would become a Q/DQ scale as it is)."""
    # (a pipe waited for a writer, /dev/zero never ended; a killed calibrate's staged cache is swept)
    p = check_input_file(path, "calibration cache", sweep=True)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read calibration cache '{p}' ({e}).") from e
    if not lines or not lines[0].startswith("TRT-"):
        raise UserError(
            f"'{p}' is not a TensorRT calibration cache: the first line must be 'TRT-<version>-<algo>'."
        )
    scales: dict[str, float] = {}
    for no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, hexval = line.rpartition(": ")
        try:
            if not sep:
                raise ValueError("no ': ' separator")
            (scale,) = struct.unpack("!f", bytes.fromhex(hexval.strip()))
        except (ValueError, struct.error) as e:
            raise UserError(
                f"calibration cache '{p}' line {no} is not '<tensor>: <8 hex digits>' ({line[:80]!r}: {e})."
            ) from e
        if not (math.isfinite(scale) and scale > 0):
            raise UserError(
                f"calibration cache '{p}' line {no} gives tensor {shown(name)} the scale {scale}; a "
                "quantization scale is a finite number above 0 (the cache is corrupted: calibrate again "
                "without it)."
            )
        scales[name] = scale
    return lines[0], scales
