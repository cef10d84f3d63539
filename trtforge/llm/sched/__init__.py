"""Scheduling without a model: the paged KV block manager, request state, and the continuous-batching
scheduler, whose ``schedule()`` returns a step plan (``plan.py``) and whose ``update(plan, tokens)``
applies the sampled tokens; the loop that runs plans is ``trtforge.llm.loop``.

Pure Python over block ids; imports ``trtforge.errors``, ``llm.sampling`` and the step protocol of
``llm.executors.base``, never an executor implementation or ``llm.compile``.
"""
