"""Every Triton kernel of trtforge with its launch helpers: flash attention (Triton and the Gluon Hopper
kernel), split-KV decode, chunked prefill, paged cache write, GEMV and fused layer pieces.

May import ``trtforge.errors`` and ``trtforge.core`` only; never TensorRT. Importing this package is
cheap: each module loads torch/Triton itself.
"""
