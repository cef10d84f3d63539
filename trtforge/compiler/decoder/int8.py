"""Moved to :mod:`trtforge.llm.compile.int8`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.compile.int8")
