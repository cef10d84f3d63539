"""Graph passes: verified rewrites of exported ONNX graphs into fused forms (LayerNorm, GELU, QKV,
attention, rotary, SwiGLU, paged attention), each checked by ONNX Runtime; ``precision/`` casts graphs.

May import ``trtforge.core``, ``numerics``, ``calibration`` and ``plugins`` (ONNX node forms).
"""
