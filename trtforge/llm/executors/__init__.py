"""Step executors: each runs :class:`~trtforge.llm.executors.base.StepBatch` batches over paged KV pools.

``torch`` (:mod:`.torch_exec`, a transformers model in eager torch), ``onnxruntime``
(:mod:`.onnxruntime_exec`, an exported paged step graph in exact ONNX Runtime) and ``tensorrt``
(:mod:`.tensorrt_exec`, the paged step engine on a GPU); the graph executors share one feed mapping
(:mod:`.paged_feeds`). :mod:`.onnxruntime_slot` runs slot-layout step graphs for the simple greedy loop.
:mod:`.tensor_parallel` drives N worker processes, each a rank of a sharded torch executor.
:mod:`.kv_cache` is the torch executor's KV cache element type (``kv_cache_dtype``: auto / fp8) and
its FP8 scales.

May import ``core``, ``kernels``, ``plugins``, ``runtime``, ``numerics``, ``llm.contract``, ``llm.models`` and
``llm.quant``;
never ``llm.compile`` (what both need is in ``llm.contract``).
"""

from trtforge.llm.executors.onnxruntime_exec import OrtPagedExecutor
from trtforge.llm.executors.onnxruntime_slot import OrtStepExecutor
from trtforge.llm.executors.tensorrt_exec import TrtPagedExecutor

EXECUTORS = ("onnxruntime", "tensorrt", "torch")

__all__ = ["EXECUTORS", "OrtPagedExecutor", "OrtStepExecutor", "TrtPagedExecutor"]
