"""TensorRT plugins (IPluginV3) and their kernels, plus ONNX Runtime reference implementations."""
