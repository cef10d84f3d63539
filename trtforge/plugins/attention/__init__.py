"""Attention plugins: ``trtforge::FlashAttention`` (the `plugin` attention strategy) and
``trtforge::PagedAttention`` (a paged step graph's cache write + attention), each an IPluginV3 over
:mod:`trtforge.kernels`, with its ONNX node form.

Modules (import the one you need; this package imports nothing heavy):

- ``spec``: the ops' names, attributes and validation (pure Python).
- ``onnx_node`` / ``paged_onnx_node``: the ONNX nodes and their model-local reference functions.
- ``plugin`` / ``paged_plugin``: the IPluginV3 / creator classes and their registration.
- ``plugin_common``: fields, dtypes, creator and methods both plugins share.

May import ``trtforge.errors``, ``trtforge.core`` and ``trtforge.kernels``.
"""
