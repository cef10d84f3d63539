"""Moved to :mod:`trtforge.llm.compile` (HF causal LM -> step graph -> step engine); the submodules here
are the old import paths (``from trtforge.compiler.decoder import export``)."""
