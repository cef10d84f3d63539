"""Graph passes: verified rewrites of exported ONNX graphs into fused forms (LayerNorm, GELU, QKV, attention)."""
