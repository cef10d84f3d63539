"""TensorRT-format calibration cache (text, per-tensor activation scales) for interchange.

Format, as TensorRT's calibrators wrote it and as ModelOpt's ``import_scales_from_calib_cache``
reads it: a header line ``TRT-<version>-<Algorithm>``, then one ``<tensor name>: <scale>`` line per
tensor, the scale being the float32 (amax / 127) as 8 hex digits of its big-endian bytes
(``struct.pack('!f', scale).hex()``).
"""

from __future__ import annotations

import math
import os
import struct
from importlib import metadata
from pathlib import Path

from trtforge._fileio import atomic_write_text, check_input_file
from trtforge.errors import UserError, shown

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


def format_cache(scales: dict[str, float], method: str) -> str:
    """The cache text for `scales` (tensor -> scale) calibrated with `method`."""
    lines = [f"TRT-{_trt_version_tag()}-{ALGORITHMS.get(method, 'EntropyCalibration2')}"]
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


def write_calibration_cache(path: str | os.PathLike[str], scales: dict[str, float], method: str) -> Path:
    """Write the cache atomically; returns its path."""
    atomic_write_text(path, format_cache(scales, method))
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
