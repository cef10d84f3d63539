"""Accuracy and latency reports comparing torch, ONNX Runtime variants and TensorRT engines."""
