"""Generation over compiled decoder step graphs: `trtforge.llm.load(path).generate(prompts)`."""

from __future__ import annotations

from trtforge.llm.api import LLM, load

__all__ = ["LLM", "load"]
