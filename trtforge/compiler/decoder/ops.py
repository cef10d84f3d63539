"""Moved to :mod:`trtforge.llm.compile.ops`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.compile.ops")
