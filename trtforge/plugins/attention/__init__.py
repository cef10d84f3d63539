"""The `plugin` attention strategy: a Triton flash-attention kernel inside a TensorRT IPluginV3.

Modules (import the one you need; this package imports nothing heavy):

- ``spec``: the op's names, attributes and validation (pure Python).
- ``configs``: kernel launch configurations = TensorRT tactics (pure Python).
- ``onnx_node``: ``make_flash_attention_node`` and ``add_reference_function`` (onnx_ir, ONNX Runtime).
- ``kernel``: the Triton kernel and its launchers (torch, Triton).
- ``plugin``: the IPluginV3 / creator classes, ``register_plugins`` and ``check_plugin_support``.

Decode (KV cache) side:

- ``decode_kernel``: split-KV (FlashDecoding) decode attention, contiguous or paged cache, GQA,
  q_len 1..8 (torch, Triton).
- ``paged_cache``: reshape-and-cache (new K/V rows into their slots) and ``paged_attention_step``.
- ``chunked_prefill``: a prompt chunk over a cached prefix, contiguous or paged, GQA.
- ``paged_onnx_node``: the ``trtforge::PagedAttention`` node and its ONNX reference function.
- ``paged_plugin``: the PagedAttention IPluginV3 (pool outputs aliased to pool inputs).
"""
