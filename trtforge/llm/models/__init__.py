"""One adapter per supported decoder family: what the model is and its layer math, read by the
step-graph export (``llm.compile``) and by every executor.

May import ``trtforge.errors``, ``trtforge.core`` and ``trtforge.llm.contract``; never ``llm.compile``.
"""
