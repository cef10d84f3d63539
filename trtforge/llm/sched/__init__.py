"""Scheduling without a model: the paged KV block manager and the continuous-batching scheduler.

Pure Python over block ids; imports ``trtforge.errors``, ``llm.sampling`` and the step protocol of
``llm.executors.base``, never an executor implementation or ``llm.compile``.
"""
