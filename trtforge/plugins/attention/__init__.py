"""The `plugin` attention strategy: a Triton flash-attention kernel inside a TensorRT IPluginV3.

Modules (import the one you need; this package imports nothing heavy):

- ``spec``: the op's names, attributes and validation (pure Python).
- ``configs``: kernel launch configurations = TensorRT tactics (pure Python).
- ``onnx_node``: ``make_flash_attention_node`` and ``add_reference_function`` (onnx_ir, ONNX Runtime).
- ``kernel``: the Triton kernel and its launchers (torch, Triton).
- ``plugin``: the IPluginV3 / creator classes, ``register_plugins`` and ``check_plugin_support``.
"""
