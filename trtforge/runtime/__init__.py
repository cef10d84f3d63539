"""Runtime: load engines, run them on several CUDA streams with dynamic tensor memory."""
