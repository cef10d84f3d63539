"""Step executors: each runs :class:`trtforge.llm.executor.StepBatch` batches over paged KV pools it owns."""
