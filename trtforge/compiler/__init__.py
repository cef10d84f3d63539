"""The encoder compiler: torch -> ONNX export, the compile pipeline and session, engine build,
shape checks and Triton export.

May import the encoder wing below it (``core``, ``numerics``, ``passes``, ``calibration``, ``plugins``,
``runtime``, ``kernels``); never ``reports``, ``llm`` or ``cli``.
"""
