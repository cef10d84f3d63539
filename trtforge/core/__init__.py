"""The ground floor: contracts every stage shares (manifest, TensorRT backend adapter, ONNX I/O, shapes,
option policy, tensor spec, version, the garbage collector paused for CUDA graph captures).

May import only ``trtforge.errors`` and ``trtforge._fileio``; every other trtforge package imports it.
"""

from trtforge.core.version import __version__

__all__ = ["__version__"]
