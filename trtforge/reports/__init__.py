"""Accuracy and latency reports comparing torch, ONNX Runtime variants and TensorRT engines.

The encoder wing's top floor: a report exports and compiles the model for its targets, so it may
import ``compiler`` and everything below it; nothing but ``cli`` and the demo imports it.
"""
