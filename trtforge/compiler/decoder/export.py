"""Moved to :mod:`trtforge.llm.compile.export`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.compile.export")
