"""Moved to :mod:`trtforge.llm.compile.compile`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.compile.compile")
