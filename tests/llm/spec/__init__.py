"""Tests of speculative decoding (trtforge.llm.spec, trtforge.llm.spec_loop)."""
