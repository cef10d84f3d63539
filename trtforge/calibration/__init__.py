"""INT8 calibration: datasets, activation statistics and explicit Q/DQ insertion that TensorRT fuses.

Modules: ``data`` (datasets -> feed dicts), ``sources`` (files, text, functions -> validated chunks),
``calibrator`` + ``histogram`` (streaming ORT statistics), ``methods`` (max / percentile / entropy / MSE
ranges), ``placement`` (where Q/DQ goes, with reasons), ``qdq`` (insertion), ``smoothquant``,
``fallback`` (accuracy-guided), ``cache`` (TensorRT calibration cache), ``api`` (:func:`calibrate_model`).
Attributes load lazily: importing this package is cheap.
May import ``trtforge.core`` and ``trtforge.numerics``.
"""

from __future__ import annotations

from trtforge._lazy import lazy_attributes

_LAZY = {
    "calibrate_model": "trtforge.calibration.api",
    "CalibrationRecord": "trtforge.calibration.api",
    "load_dataset": "trtforge.calibration.data",
    "input_specs_from_model": "trtforge.calibration.data",
    "CalibrationDataset": "trtforge.calibration.data",
    "read_calibration_cache": "trtforge.calibration.cache",
    "write_calibration_cache": "trtforge.calibration.cache",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
