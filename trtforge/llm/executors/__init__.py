"""Step executors: each runs :class:`trtforge.llm.executor.StepBatch` batches over paged KV pools it owns.

``torch`` (:mod:`.torch_exec`, a transformers model in eager torch) and ``onnxruntime``
(:mod:`.onnxruntime_exec`, an exported paged step graph in exact ONNX Runtime); :mod:`.onnxruntime_slot`
runs slot-layout step graphs for the simple greedy loop.
"""

from trtforge.llm.executors.onnxruntime_exec import OrtPagedExecutor
from trtforge.llm.executors.onnxruntime_slot import OrtStepExecutor

EXECUTORS = ("onnxruntime", "torch")

__all__ = ["EXECUTORS", "OrtPagedExecutor", "OrtStepExecutor"]
