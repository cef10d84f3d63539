"""Compiler stages: torch -> ONNX export, the TensorRT backend adapter, engine build, manifests."""
