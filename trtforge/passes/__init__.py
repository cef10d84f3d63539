"""Graph passes: verified rewrites of exported ONNX graphs into fused forms.

LayerNorm, GELU, QKV projection merge and attention, each checked by ONNX Runtime.
"""
