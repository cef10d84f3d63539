"""Moved to :mod:`trtforge.llm.models.families`."""

from trtforge._compat import moved

moved(__name__, "trtforge.llm.models.families")
