"""Moved to :mod:`trtforge.llm.compile.step`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.compile.step")
