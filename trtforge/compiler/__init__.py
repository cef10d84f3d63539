"""The encoder pipeline: torch/.onnx/.pt2 -> ONNX (``export``, ``sources``), graph stages (``stages``),
TensorRT network and engine build (``network``, ``build``), and ``session``: the ONE compile session (output
checks, work dir, timed stages, crash-safe publish) that ``pipeline.compile_model`` and the decoder wing's
``compile_generate`` both use.

May import the encoder wing (core, kernels, numerics, plugins, passes, calibration, runtime); never
``reports``, ``llm`` or ``cli``.
"""
