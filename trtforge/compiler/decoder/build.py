"""Moved to :mod:`trtforge.llm.compile.build`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.compile.build")
