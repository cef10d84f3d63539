"""TensorRT plugins (IPluginV3) and their ONNX node forms with ONNX Runtime reference functions;
the kernels they launch live in :mod:`trtforge.kernels`.

May import ``trtforge.errors``, ``trtforge.core`` and ``trtforge.kernels``.
"""
