"""``trtforge serve``: an OpenAI-compatible HTTP server over the LLM engine (FastAPI + uvicorn).

Its dependencies are the optional extra ``trtforge[serve]``; nothing here is imported by
``import trtforge`` or ``trtforge.llm``. :func:`run` serves until SIGTERM or Ctrl-C, then drains.
"""

from __future__ import annotations

from trtforge.llm.server.run import ServeOptions, run

__all__ = ["ServeOptions", "run"]
